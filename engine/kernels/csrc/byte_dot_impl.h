// 8-bit affine and MXFP4 weights by bf16 x on AVX512-VNNI: x rounded to 8-bit integers (each 32
// values by their largest magnitude, as llama.cpp's Q8_0 rounds x), and vpdpbusd multiplying 64
// unsigned bytes of weights by 64 signed bytes of x into 16 lanes of 4 products, exactly. The
// fp32 paths these replace took a conversion and an FMA per 16 weights (8 bits) or two table
// lookups and two FMAs per 32 (MXFP4): bound by their instructions, not by memory.
// - 8 bits: the codes are the unsigned bytes as stored; each lane's sum is scaled by its weight
//   group's scale times its x's step, and the biases' term is the sum over groups of bias times
//   x's sum, as the other paths take it.
// - MXFP4: each code's value, doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), plus 12 is
//   an unsigned byte (a vpshufb); each lane's sum less 12 times the lane's sum of x is the dot
//   product with the doubled values, scaled by 2^(e - 128) and x's step.
// isa_impl.h includes this inside its namespace, with EXO_BF16_DOT.

// x as this path reads it, per row, in blocks of 128 values (the row padded with zeros to a
// whole block), 256 bytes a block: 128 integers, in order (8 bits) or the block's even values
// then its odd ones (MXFP4: the order of a packed byte's low and high nibbles); then 16 floats,
// the step of each lane's values (8 bits: those of the block's first 64 values, and 16 more for
// its second 64 after them; MXFP4: each lane's step halved, for the doubled codes); for MXFP4
// the next 64 bytes are 16 int32, 12 times the sum of each lane's 8 integers.
constexpr int BYTE_BLOCK = 128;
constexpr std::size_t BYTE_BLOCK_BYTES = 256;

inline std::size_t byte_x_row_bytes(int k) { return byte_x_bytes(1, k); }

// `sums` gets each 32 values' sum as rounded (integers times step), for the biases' term.
void prepare_byte_x(const uint16_t* x, int rows, int k, bool fp4, int8_t* out, float* sums) {
  const int blocks = (k + BYTE_BLOCK - 1) / BYTE_BLOCK;
  for (int m = 0; m < rows; ++m) {
    const uint16_t* row = x + static_cast<std::size_t>(m) * k;
    int8_t* row_out = out + static_cast<std::size_t>(m) * byte_x_row_bytes(k);
    for (int b = 0; b < blocks; ++b) {
      int8_t values[BYTE_BLOCK] = {};
      float steps[4] = {};
      for (int g = 0; g < 4; ++g) {
        const int first = b * BYTE_BLOCK + 32 * g;
        if (first >= k) break;
        // 32 values as two vectors of 16 floats.
        __m512 v[2];
        for (int h = 0; h < 2; ++h)
          v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(
              _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + first + 16 * h))), 16));
        const __m512 a0 = _mm512_abs_ps(v[0]), a1 = _mm512_abs_ps(v[1]);
        const __m512 largest = _mm512_set1_ps(3.4028235e38f);
        const bool finite = (_mm512_cmp_ps_mask(a0, largest, _CMP_NLE_UQ) |
                             _mm512_cmp_ps_mask(a1, largest, _CMP_NLE_UQ)) == 0;
        const float top = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
        // As the other paths: a group under 1e-34 counts as zeros, and a group with a value that
        // is not finite gets a NaN step, so that the output is too and is computed again.
        const bool usable = finite && top >= 1e-34f;
        const __m512 inverse = _mm512_set1_ps(usable ? 127.0f / top : 0.0f);
        steps[g] = !finite ? std::numeric_limits<float>::quiet_NaN() : usable ? top / 127.0f : 0.0f;
        int total = 0;
        for (int h = 0; h < 2; ++h) {
          // Rounded to the nearest, ties to even (the default rounding mode).
          const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inverse));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(values + 32 * g + 16 * h), _mm512_cvtsepi32_epi8(q));
          total += _mm512_reduce_add_epi32(q);
        }
        sums[static_cast<std::size_t>(m) * (k / 32) + first / 32] = static_cast<float>(total) * steps[g];
      }
      int8_t* block = row_out + static_cast<std::size_t>(b) * BYTE_BLOCK_BYTES;
      float* lane_steps = reinterpret_cast<float*>(block + BYTE_BLOCK);
      if (!fp4) {
        std::memcpy(block, values, BYTE_BLOCK);
        for (int lane = 0; lane < 16; ++lane) {  // lane l: values 4l..4l+3 of each 64
          lane_steps[lane] = steps[lane / 8];
          lane_steps[16 + lane] = steps[2 + lane / 8];
        }
        continue;
      }
      int32_t* offsets = reinterpret_cast<int32_t*>(block + BYTE_BLOCK + 64);
      for (int i = 0; i < 64; ++i) {
        block[i] = values[2 * i];
        block[64 + i] = values[2 * i + 1];
      }
      for (int lane = 0; lane < 16; ++lane) {  // lane l: values 8l..8l+7, group l / 4
        lane_steps[lane] = steps[lane / 4] * 0.5f;
        int total = 0;
        for (int i = 0; i < 8; ++i) total += values[8 * lane + i];
        offsets[lane] = 12 * total;
      }
    }
  }
}

template <int MR, int NR, int GS>
inline void byte_dot8_block(const QuantizedArgs& a, int n, int m0) {
  const int k_all = a.k, groups = k_all / GS;
  const std::size_t x_row = byte_x_row_bytes(k_all);
  const int8_t* x = a.xb + static_cast<std::size_t>(m0) * x_row;
  const float* xsum = a.xsum + static_cast<std::size_t>(m0) * groups;
  const WeightRows<NR, bf16> block(a, n, static_cast<std::size_t>(k_all), groups);
  const auto& [rows, scales, biases] = block;
  const std::size_t ahead = NR == 1 ? PREFETCH_AHEAD : NR * static_cast<std::size_t>(k_all);
  __m512 total[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) total[r][m] = _mm512_setzero_ps();
  for (int v0 = 0; v0 < k_all; v0 += 64) {
    const std::size_t at = static_cast<std::size_t>(v0 / BYTE_BLOCK) * BYTE_BLOCK_BYTES;
    const int half = (v0 % BYTE_BLOCK) / 64;
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[r] + v0) + ahead, _MM_HINT_T0);
      if (NR == 1) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + v0) + L2_AHEAD, _MM_HINT_T1);
      const __m512i w = _mm512_loadu_si512(rows[r] + v0);
      __m512 scale;
      if constexpr (GS == 32)
        scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(to_float(scales[r][v0 / 32])),
                                     _mm512_set1_ps(to_float(scales[r][v0 / 32 + 1])));
      else
        scale = _mm512_set1_ps(to_float(scales[r][v0 / GS]));
      for (int m = 0; m < MR; ++m) {
        const int8_t* xb = x + static_cast<std::size_t>(m) * x_row + at;
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w,
                                                _mm512_loadu_si512(xb + 64 * half));
        const __m512 steps = _mm512_loadu_ps(reinterpret_cast<const float*>(xb + BYTE_BLOCK) + 16 * half);
        total[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, steps), total[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] =
          _mm512_reduce_add_ps(total[r][m]) +
          bias_term(biases[r], xsum + static_cast<std::size_t>(m) * groups, groups);
}

template <int MR, int NR>
inline void byte_dot_fp4_block(const QuantizedArgs& a, int n, int m0) {
  const int k_all = a.k, groups = k_all / 32, blocks = (k_all + BYTE_BLOCK - 1) / BYTE_BLOCK;
  const std::size_t x_row = byte_x_row_bytes(k_all), row_bytes = static_cast<std::size_t>(k_all) / 2;
  const int8_t* x = a.xb + static_cast<std::size_t>(m0) * x_row;
  const WeightRows<NR, e8m0> block(a, n, row_bytes, groups);
  const auto& [rows, scales, biases] = block;
  const std::size_t ahead = NR == 1 ? PREFETCH_AHEAD : NR * row_bytes;
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i codes = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i lane_group = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512 total[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) total[r][m] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    // The last block of a row of 64 modulo 128 values: its 32 bytes and 2 scales, the rest 0
    // (their x is 0 too).
    const bool whole = BYTE_BLOCK * (b + 1) <= k_all;
    for (int r = 0; r < NR; ++r) {
      const uint8_t* bytes = rows[r] + static_cast<std::size_t>(b) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(bytes) + ahead, _MM_HINT_T0);
      if (NR == 1) _mm_prefetch(reinterpret_cast<const char*>(bytes) + L2_AHEAD, _MM_HINT_T1);
      const __m512i w = whole ? _mm512_loadu_si512(bytes) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, bytes);
      const __m512i low = _mm512_shuffle_epi8(codes, _mm512_and_si512(w, nibble));
      const __m512i high = _mm512_shuffle_epi8(codes, _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble));
      uint32_t four = 0;  // (a memcpy of a constant size: no call)
      if (whole)
        std::memcpy(&four, &scales[r][4 * b].bits, 4);
      else
        std::memcpy(&four, &scales[r][4 * b].bits, 2);
      // 2^(e - 127) as a float's exponent; e = 0 (2^-127) counts as 0.
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_permutexvar_epi32(lane_group, _mm512_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(four)))), 23));
      for (int m = 0; m < MR; ++m) {
        const int8_t* xb = x + static_cast<std::size_t>(m) * x_row + static_cast<std::size_t>(b) * BYTE_BLOCK_BYTES;
        __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), low, _mm512_loadu_si512(xb));
        sum = _mm512_dpbusd_epi32(sum, high, _mm512_loadu_si512(xb + 64));
        sum = _mm512_sub_epi32(sum, _mm512_loadu_si512(xb + BYTE_BLOCK + 64));
        const __m512 steps = _mm512_loadu_ps(reinterpret_cast<const float*>(xb + BYTE_BLOCK));
        total[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, steps), total[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] = _mm512_reduce_add_ps(total[r][m]);
}

// As nibble_dot_gemv: rows shorter than a page one at a time, longer ones 4 a block for several
// rows of x.
template <typename Block>
void byte_dot_rows(const QuantizedArgs& a, int n0, int n1, std::size_t row_bytes, Block&& blocks) {
  const bool short_rows = row_bytes < PAGE_BYTES;
  for (int nb = n0; nb < n1; nb += WEIGHT_ROWS_PER_PASS) {
    const int ne = std::min(n1, nb + WEIGHT_ROWS_PER_PASS);
    row_blocks<LOOKUP_ROWS>(a.rows, [&]<int MR>(int m) {
      int n = nb;
      if (MR > 1 && !short_rows)
        for (; n + 4 <= ne; n += 4) blocks.template operator()<MR, 4>(n, m);
      for (; n < ne; ++n) blocks.template operator()<MR, 1>(n, m);
    });
  }
}

void byte_dot_gemv(const QuantizedArgs& a, int n0, int n1) {
  if (a.mxfp4) {
    return byte_dot_rows(a, n0, n1, static_cast<std::size_t>(a.k) / 2,
                         [&]<int MR, int NR>(int n, int m) { byte_dot_fp4_block<MR, NR>(a, n, m); });
  }
  const std::size_t row_bytes = static_cast<std::size_t>(a.k);
  if (a.group_size == 32)
    return byte_dot_rows(a, n0, n1, row_bytes,
                         [&]<int MR, int NR>(int n, int m) { byte_dot8_block<MR, NR, 32>(a, n, m); });
  if (a.group_size == 64)
    return byte_dot_rows(a, n0, n1, row_bytes,
                         [&]<int MR, int NR>(int n, int m) { byte_dot8_block<MR, NR, 64>(a, n, m); });
  return byte_dot_rows(a, n0, n1, row_bytes,
                       [&]<int MR, int NR>(int n, int m) { byte_dot8_block<MR, NR, 128>(a, n, m); });
}
