// The 4-bit GEMV for several rows of x on 8-bit integers of x (vpdpbusd), once per instruction
// set with AVX512-VNNI: isa_impl.h includes this inside its namespace, after the 16-bit path
// (prepare_int_x) and row_blocks.

// x for several rows (batched decoding, prefill) as 8-bit integers, for vpdpbusd: it multiplies
// 64 unsigned bytes (the nibbles, unpacked by a mask, or a shift and a mask) by 64 signed bytes
// and adds each 4 into a 32-bit lane, exactly: twice the products of vpdpwssd an instruction.
// With several rows of x the GEMV is bound by its instructions, not by memory: per lane of sums
// it also takes a conversion, a multiply (the weights' scale by x's) and an FMA, so the more
// products a lane adds before them the better. Here a lane adds 32 (8 vpdpbusd), all of one
// 32 values of the weights (see prepare_int8_512), and x is scaled per 64 values: each 64 by
// their largest magnitude to at most 127, rounded to the nearest integer (a value is off by at
// most max / 254), as llama.cpp's Q8 formats round x (blocks of 32 in Q8_0, 256 in Q8_K).
// A row of x is stored in steps of 512 values (the last of 256 where its length is not a
// multiple of 512), each step its integers, then 16 floats (see int8_x_offset): the step of
// each lane of the sums (NaN where one of its values is not finite, so that the output is too
// and is computed again the MLX way). `sums` gets each 32 values' sum as rounded (the
// integers' sum times their step), for the biases' term: with x's own sums there, each output
// would move by the rounding of x times scale * q, which is larger than the weight,
// scale * q + bias, itself (about 3x, measured).

#include "int8_quantize.h"

// The 16 dwords of a, b, c and d transposed within each 128-bit part: part p of the result i
// holds dword i of part p of a, b, c and d. Lane 4p + r of result i is then dword 4p + i of
// the r-th input.
inline void transpose_dwords(__m512i& a, __m512i& b, __m512i& c, __m512i& d) {
  const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
  const __m512i t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
  a = _mm512_unpacklo_epi64(t0, t2);
  b = _mm512_unpackhi_epi64(t0, t2);
  c = _mm512_unpacklo_epi64(t1, t3);
  d = _mm512_unpackhi_epi64(t1, t3);
}

// Lane L of a 512-value step's sums covers the 32 values from 32 * int8_chunk(L) (see
// prepare_int8_512).
constexpr int int8_chunk(int lane) { return 4 * (lane % 4) + lane / 4; }

// For a permute: lane L gets entry int8_chunk(L) / PER, the group of PER * 32 values it covers.
template <int PER>
inline __m512i int8_lane_groups() {
  alignas(64) static constexpr auto table = [] {
    std::array<int, 16> groups{};
    for (int lane = 0; lane < 16; ++lane) groups[lane] = int8_chunk(lane) / PER;
    return groups;
  }();
  return _mm512_load_si512(table.data());
}

// 512 values of x (a step of the 8-bit layout). The weights' 256 packed bytes are read as 4
// vectors and their dwords transposed (transpose_dwords): lane L of each then holds 4 bytes,
// 8 values, of the same 32 values (int8_chunk(L)), and unpacked (low nibbles, high nibbles)
// they make 8 vectors whose lane L adds 32 products of those 32 values. x is stored in the
// same order: its even values, in the order of the packed bytes, transposed as the weights'
// are, and its odd values likewise; vector 2i the even values of transposed vector i, 2i + 1
// the odd ones. Then the 16 floats of each lane's step.
void prepare_int8_512(const uint16_t* x, int8_t* out, float* sums) {
  alignas(64) int8_t even[256], odd[256];
  alignas(64) float block_step[8];
  for (int block = 0; block < 8; ++block) {
    const Int8Block q = quantize_64(x + 64 * block);
    block_step[block] = q.step;
    for (int i = 0; i < 2; ++i) {
      const int chunk = 2 * block + i;  // of 32 values: packed bytes 16 chunk .. 16 chunk + 15
      sums[chunk] = static_cast<float>(_mm512_reduce_add_epi32(
                        _mm512_add_epi32(q.even[i], q.odd[i]))) * q.step;
      _mm_store_si128(reinterpret_cast<__m128i*>(even + 16 * chunk), _mm512_cvtsepi32_epi8(q.even[i]));
      _mm_store_si128(reinterpret_cast<__m128i*>(odd + 16 * chunk), _mm512_cvtsepi32_epi8(q.odd[i]));
    }
  }
  for (int8_t* values : {even, odd}) {
    __m512i v[4];
    for (int j = 0; j < 4; ++j) v[j] = _mm512_load_si512(values + 64 * j);
    transpose_dwords(v[0], v[1], v[2], v[3]);
    const int parity = values == even ? 0 : 1;
    for (int j = 0; j < 4; ++j) _mm512_store_si512(out + 64 * (2 * j + parity), v[j]);
  }
  _mm512_store_ps(reinterpret_cast<float*>(out + 512),
                  _mm512_permutexvar_ps(int8_lane_groups<2>(),  // x's steps are per 64 values
                                        _mm512_castps256_ps512(_mm256_load_ps(block_step))));
}

// 256 values of x, the last of a row whose length is not a multiple of 512, in the layout of
// nibble_dot8_256: four vectors of 64 bytes, X0 = the even values of chunks (b0 t0, b0 t2, b1
// t0, b1 t2) of its two blocks of 128 (chunk t of a block: its values 32t..32t+31, its even
// values the low nibbles of packed bytes 16t..16t+15, its odd ones their high nibbles), X1 =
// the even values of (b0 t1, b0 t3, b1 t1, b1 t3), X2 and X3 the odd values of the same. The
// 16-byte part p of each belongs to group (of 64) p. Then each lane's step: lane l that of
// group l / 4.
void prepare_int8_256(const uint16_t* x, int8_t* out, float* sums) {
  alignas(16) float group_step[4];
  for (int group = 0; group < 4; ++group) {
    // Group p: chunks t0, t1 (p even) or t2, t3 (p odd) of block p / 2.
    const int block = group / 2, first = 2 * (group % 2);
    const Int8Block q = quantize_64(x + 128 * block + 32 * first);
    group_step[group] = q.step;
    for (int i = 0; i < 2; ++i) {
      sums[4 * block + first + i] = static_cast<float>(_mm512_reduce_add_epi32(
                                        _mm512_add_epi32(q.even[i], q.odd[i]))) * q.step;
      int8_t* at = out + 16 * group;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(at + 64 * i), _mm512_cvtsepi32_epi8(q.even[i]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(at + 128 + 64 * i),
                       _mm512_cvtsepi32_epi8(q.odd[i]));
    }
  }
  const __m512i lane_group = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512 four = _mm512_castps128_ps512(_mm_load_ps(group_step));
  _mm512_storeu_ps(reinterpret_cast<float*>(out + 256),
                   _mm512_permutexvar_ps(lane_group, four));
}

void prepare_int8_x(const uint16_t* x, int rows, int k, int8_t* xq, float* sums) {
  const int steps = (k + INT8_STEP_VALUES - 1) / INT8_STEP_VALUES;
  for (int m = 0; m < rows; ++m)
    for (int step = 0; step < steps; ++step) {
      const std::size_t at = static_cast<std::size_t>(m) * k + static_cast<std::size_t>(step) * INT8_STEP_VALUES;
      int8_t* out = xq + int8_x_offset(rows, k, m, step);
      if (k - step * INT8_STEP_VALUES >= INT8_STEP_VALUES)
        prepare_int8_512(x + at, out, sums + at / 32);
      else
        prepare_int8_256(x + at, out, sums + at / 32);
    }
}

// The weights' scales of 256 values, for the lanes of nibble_dot8_256's sums: lane l covers
// group (of 64) l / 4. For groups of 32, `second` picks the second 32 of each 64 (the sums of
// X1 and X3), else the first (X0 and X2).
template <int GS>
inline __m512 scales_of_256(const uint16_t* scales, int block, bool second = false) {
  __m512i index;
  __m512i words;
  if constexpr (GS == 128) {  // two groups, each two parts
    uint32_t two;
    std::memcpy(&two, scales + 2 * block, 4);
    words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_cvtsi32_si128(static_cast<int>(two))));
    index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  } else if constexpr (GS == 64) {
    words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales + 4 * block))));
    index = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  } else {  // 32: eight groups, the first or second of each 64
    words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 8 * block))));
    index = second ? _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1)
                   : _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  }
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_permutexvar_epi32(index, words), 16));
}

// Lane i of the result: the sum of the lanes of v[i], for 8 or 16 vectors (a transposing tree:
// about 3 instructions an output where a reduction of each takes about 8).
template <int N>
inline __m512 sum_each(const __m512* v) {
  static_assert(N == 8 || N == 16);
  __m512 pairs[N / 2], quads[N / 4];
  for (int i = 0; i < N / 2; ++i)  // a chunk: halves of v[2i] and v[2i+1], interleaved
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < N / 4; ++i) {  // a chunk: lane j the chunk's sum of v[4i + j]
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  if constexpr (N == 8) {
    // Chunks (q0 c0+c1, q0 c2+c3, q1 c0+c1, q1 c2+c3), then each pair of chunks added.
    const __m512 halves = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                        _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
    const __m512 total = _mm512_add_ps(halves, _mm512_shuffle_f32x4(halves, halves, 0xB1));
    // Chunks 0 and 2 hold v[0..3] and v[4..7]: bring them together.
    return _mm512_shuffle_f32x4(total, total, 0x08);
  } else {
    __m512 halves[2];
    for (int i = 0; i < 2; ++i)
      halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                                _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88),
                         _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD));
  }
}

// The weights' scales of 512 values, for the lanes of nibble_dot8_512's sums: lane L that of
// the 32 values int8_chunk(L).
template <int GS>
inline __m512 scales_of_512(const uint16_t* scales, int step) {
  const uint16_t* at = scales + step * (512 / GS);
  __m512i words;
  if constexpr (GS == 32)
    words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
  else if constexpr (GS == 64)
    words = _mm512_cvtepu16_epi32(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
  else
    words = _mm512_cvtepu16_epi32(
        _mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_permutexvar_epi32(int8_lane_groups<GS / 32>(), words), 16));
}

// One weight row's 512 values (256 packed bytes) against MR rows of x, each `x_stride` bytes
// apart: the bytes' dwords transposed and unpacked once for all rows (see prepare_int8_512),
// then each row of x takes 8 vpdpbusd, a conversion, a multiply and an FMA.
template <int MR, int GS>
inline void nibble_dot8_512(const uint8_t* bytes, std::size_t row_bytes, const uint16_t* scales,
                            int step, const int8_t* x, std::size_t x_stride, __m512* total) {
  // The same bytes 4 rows on (1, 2 and 4 rows ahead measured alike: this loop is bound by its
  // instructions, not by memory).
  for (int line = 0; line < 4; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(bytes) + 4 * row_bytes + 64 * line, _MM_HINT_T0);
  __m512i a = _mm512_loadu_si512(bytes), b = _mm512_loadu_si512(bytes + 64);
  __m512i c = _mm512_loadu_si512(bytes + 128), d = _mm512_loadu_si512(bytes + 192);
  transpose_dwords(a, b, c, d);
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i w[8] = {
      _mm512_and_si512(a, nibble), _mm512_and_si512(_mm512_srli_epi16(a, 4), nibble),
      _mm512_and_si512(b, nibble), _mm512_and_si512(_mm512_srli_epi16(b, 4), nibble),
      _mm512_and_si512(c, nibble), _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble),
      _mm512_and_si512(d, nibble), _mm512_and_si512(_mm512_srli_epi16(d, 4), nibble)};
  const __m512 scale = scales_of_512<GS>(scales, step);
  // One weight vector against every row of x before the next: each row's sums are a chain of 8
  // vpdpbusd, and the MR chains side by side keep the pipes busy (row by row, with two chains
  // a row, the 8-row GEMV ran 5 % slower at k 2,048).
  __m512i sums[MR];
  for (int m = 0; m < MR; ++m)
    sums[m] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_load_si512(x + m * x_stride));
  for (int j = 1; j < 8; ++j)
    for (int m = 0; m < MR; ++m)
      sums[m] = _mm512_dpbusd_epi32(sums[m], w[j], _mm512_load_si512(x + m * x_stride + 64 * j));
  for (int m = 0; m < MR; ++m) {
    const __m512 x_scale = _mm512_load_ps(reinterpret_cast<const float*>(x + m * x_stride + 512));
    total[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[m]), _mm512_mul_ps(scale, x_scale), total[m]);
  }
}

// The same for 256 values (128 packed bytes; `block` counts 256s), the last of a row whose
// length is not a multiple of 512, in prepare_int8_256's layout: the bytes unpacked (a mask for
// the low nibbles, a shift and a mask for the high ones) and their 16-byte parts regrouped to
// X0..X3's order (4 shuffles); each row of x takes 4 vpdpbusd, a conversion, a multiply and an
// FMA.
template <int MR, int GS>
inline void nibble_dot8_256(const uint8_t* bytes, const uint16_t* scales, int block,
                            const int8_t* x, std::size_t x_stride, __m512* total) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i w0 = _mm512_loadu_si512(bytes), w1 = _mm512_loadu_si512(bytes + 64);
  const __m512i lo0 = _mm512_and_si512(w0, nibble), lo1 = _mm512_and_si512(w1, nibble);
  const __m512i hi0 = _mm512_and_si512(_mm512_srli_epi16(w0, 4), nibble);
  const __m512i hi1 = _mm512_and_si512(_mm512_srli_epi16(w1, 4), nibble);
  // Parts (0, 2) and (1, 3) of each block: X0..X3's order.
  const __m512i v0 = _mm512_shuffle_i32x4(lo0, lo1, 0x88);
  const __m512i v1 = _mm512_shuffle_i32x4(lo0, lo1, 0xDD);
  const __m512i v2 = _mm512_shuffle_i32x4(hi0, hi1, 0x88);
  const __m512i v3 = _mm512_shuffle_i32x4(hi0, hi1, 0xDD);
  if constexpr (GS == 32) {  // the first 32 and the second 32 of each 64 have scales of their own
    const __m512 first = scales_of_256<GS>(scales, block, false);
    const __m512 second = scales_of_256<GS>(scales, block, true);
    for (int m = 0; m < MR; ++m) {
      const int8_t* xb = x + m * x_stride;
      const __m512 x_scale = _mm512_loadu_ps(reinterpret_cast<const float*>(xb + 256));
      const __m512i s0 = _mm512_dpbusd_epi32(
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), v0, _mm512_loadu_si512(xb)), v2,
          _mm512_loadu_si512(xb + 128));
      const __m512i s1 = _mm512_dpbusd_epi32(
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), v1, _mm512_loadu_si512(xb + 64)), v3,
          _mm512_loadu_si512(xb + 192));
      total[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(first, x_scale), total[m]);
      total[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(second, x_scale), total[m]);
    }
  } else {
    const __m512 scale = scales_of_256<GS>(scales, block);
    for (int m = 0; m < MR; ++m) {
      const int8_t* xb = x + m * x_stride;
      __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v0, _mm512_loadu_si512(xb));
      sum = _mm512_dpbusd_epi32(sum, v1, _mm512_loadu_si512(xb + 64));
      sum = _mm512_dpbusd_epi32(sum, v2, _mm512_loadu_si512(xb + 128));
      sum = _mm512_dpbusd_epi32(sum, v3, _mm512_loadu_si512(xb + 192));
      const __m512 x_scale = _mm512_loadu_ps(reinterpret_cast<const float*>(xb + 256));
      total[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, x_scale), total[m]);
    }
  }
}

// One weight row against MR rows of x (prepare_int8_x's), a step of 512 values at a time.
// Only the steps [sb0, sb1) of the row: the first range writes its outputs, and the biases'
// term, the others add to them.
template <int MR, int GS>
inline void nibble_dot8_row(const QuantizedArgs& a, int n, int m0, int sb0, int sb1) {
  const int k_all = a.k, groups = k_all / GS;
  const std::size_t row_bytes = static_cast<std::size_t>(k_all) / 2;
  // This pass's steps of rows m0.. of x (see int8_x_offset).
  const std::size_t x_stride = static_cast<std::size_t>(sb1 - sb0) * INT8_STEP_BYTES;
  const int8_t* x = a.xq8 + int8_x_offset(a.rows, k_all, m0, sb0);
  const float* xsum = a.xsum + static_cast<std::size_t>(m0) * groups;
  const std::size_t row_at = static_cast<std::size_t>(n);
  const uint8_t* row = reinterpret_cast<const uint8_t*>(a.w) + row_at * row_bytes;
  const uint16_t* scales = static_cast<const uint16_t*>(a.scales) + row_at * groups;
  const uint16_t* biases = static_cast<const uint16_t*>(a.biases) + row_at * groups;
  __m512 total[MR];
  for (int m = 0; m < MR; ++m) total[m] = _mm512_setzero_ps();
  const int full = k_all / INT8_STEP_VALUES;
  for (int sb = sb0; sb < sb1; ++sb) {
    const int8_t* xs = x + static_cast<std::size_t>(sb - sb0) * INT8_STEP_BYTES;
    if (sb < full)
      nibble_dot8_512<MR, GS>(row + static_cast<std::size_t>(sb) * 256, row_bytes, scales, sb, xs,
                              x_stride, total);
    else
      nibble_dot8_256<MR, GS>(row + static_cast<std::size_t>(sb) * 256, scales, 2 * sb, xs,
                              x_stride, total);
  }
  // The biases' term, sum over groups of bias * sum of x, into the same lanes.
  for (int g = 0; g < (sb0 == 0 ? groups : 0); g += 16) {
    const __mmask16 live = groups - g >= 16 ? __mmask16{0xFFFF}
                                            : static_cast<__mmask16>((1u << (groups - g)) - 1);
    const __m512 bias = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, biases + g)), 16));
    for (int m = 0; m < MR; ++m)
      total[m] = _mm512_fmadd_ps(
          bias, _mm512_maskz_loadu_ps(live, xsum + static_cast<std::size_t>(m) * groups + g),
          total[m]);
  }
  if constexpr (MR == 8) {
    alignas(64) float sums[16];
    _mm512_store_ps(sums, sum_each<8>(total));
    for (int m = 0; m < MR; ++m) {
      float& out = a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n];
      out = sb0 == 0 ? sums[m] : out + sums[m];
    }
  } else {
    for (int m = 0; m < MR; ++m) {
      float& out = a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n];
      const float sum = _mm512_reduce_add_ps(total[m]);
      out = sb0 == 0 ? sum : out + sum;
    }
  }
}

// Rows of x nibble_dot8_row carries in registers at once: 8 accumulators, a step's 8 sums, its 8
// unpacked weight vectors and the scales fit the 32 registers (the compiled loop spills none).
constexpr int INT8_ROWS = 8;

template <int GS>
void nibble_dot8_gemv(const QuantizedArgs& a, int n0, int n1) {
  const int supers = (a.k + INT8_STEP_VALUES - 1) / INT8_STEP_VALUES;
  for (int nb = n0; nb < n1; nb += WEIGHT_ROWS_PER_PASS) {
    const int ne = std::min(n1, nb + WEIGHT_ROWS_PER_PASS);
    for (int sb = 0; sb < supers; sb += INT8_STEPS_PER_PASS) {
      const int se = std::min(supers, sb + INT8_STEPS_PER_PASS);
      row_blocks<INT8_ROWS>(a.rows, [&]<int MR>(int m) {
        for (int n = nb; n < ne; ++n) nibble_dot8_row<MR, GS>(a, n, m, sb, se);
      });
    }
  }
}
