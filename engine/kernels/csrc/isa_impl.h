// The kernels, written once over GCC/Clang vector extensions and compiled once per instruction
// set: each isa_*.cpp defines ISA_NS, ISA_NAME and LANES, then includes this file with its own
// compiler flags, so a table never holds an instruction its CPU check did not allow.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "half_bits.h"
#include "kernels.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace exo_kernels {
namespace ISA_NS {
namespace {

constexpr int L = LANES;
typedef float vf __attribute__((vector_size(L * 4)));
typedef int32_t vi __attribute__((vector_size(L * 4)));
typedef uint32_t vu __attribute__((vector_size(L * 4)));
typedef uint8_t vb __attribute__((vector_size(L)));
typedef uint16_t vh __attribute__((vector_size(L * 2)));

// Scale and bias storage types.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return bf16_to_float(v.bits); }
inline float to_float(f16 v) { return f16_to_float(v.bits); }
// MXFP4's scales: one E8M0 byte a group, and no biases.
struct e8m0 {
  uint8_t bits;
};
inline float to_float(e8m0 v) { return e8m0_to_float(v.bits); }
template <typename S>
constexpr bool is_mxfp4 = std::is_same_v<S, e8m0>;

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// L bytes, each zero-extended to a 32-bit lane.
inline vi load_bytes(const uint8_t* p) {
#if defined(__AVX512F__) && LANES == 16
  return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__) && LANES == 8
  return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#endif
  vb b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, vi);
}
inline vf to_vf(vi v) { return __builtin_convertvector(v, vf); }

// E2M1 codes (0..15 a lane) as their values, built bit by bit: exponent e and mantissa m give
// 2^(e - 1) * (1 + m / 2), or m / 2 where e is 0; bit 3 is the sign.
inline vf e2m1_values(vi q) {
  const vi e = (q >> 1) & 3, m = q & 1;
  const vi normal = ((e + 126) << 23) | (m << 22);
  const vi subnormal = m * (126 << 23);
  vi bits = e == 0 ? subnormal : normal;
  bits |= (q & 8) << 28;
  return reinterpret_cast<vf&>(bits);
}

inline vf load_bf16(const uint16_t* p) {
  vh h;
  std::memcpy(&h, p, sizeof(h));
  vu u = __builtin_convertvector(h, vu) << 16;
  return (vf)u;
}

inline vf load_f16(const uint16_t* p) {
#if defined(__AVX512F__) && LANES == 16
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && LANES == 8
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  vf v;
  for (int i = 0; i < L; ++i) v[i] = f16_to_float(p[i]);
  return v;
#endif
}

template <typename H>
inline vf load_half(const uint16_t* p) {
  if constexpr (std::is_same_v<H, bf16>) return load_bf16(p);
  else return load_f16(p);
}
template <typename H>
inline float half_to_float(uint16_t v) {
  if constexpr (std::is_same_v<H, bf16>) return bf16_to_float(v);
  else return f16_to_float(v);
}

// The sum of a vector's lanes as a tree of halvings: a running sum over the lanes would wait on
// each of its L adds in turn, and a GEMV with short rows (a small model's) sums about as often as
// it multiplies.
inline float hsum(vf v) {
#if LANES == 16
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#elif LANES == 8
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
#else
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2);
#endif
  return v[0];
}

// Where NR packed weight rows from row n start, with their scales and biases.
template <int NR, typename S>
struct WeightRows {
  const uint8_t* rows[NR];
  const S* scales[NR];
  const S* biases[NR];
  WeightRows(const QuantizedArgs& a, int n, std::size_t row_bytes, int groups) {
    for (int r = 0; r < NR; ++r) {
      const std::size_t row = static_cast<std::size_t>(n + r);
      rows[r] = reinterpret_cast<const uint8_t*>(a.w) + row * row_bytes;
      scales[r] = static_cast<const S*>(a.scales) + row * groups;
      biases[r] = a.biases == nullptr ? nullptr : static_cast<const S*>(a.biases) + row * groups;
    }
  }
};

// A block of NR weight rows against MR rows of x. The NR * MR accumulator chains are
// independent, which hides the FMA latency; each weight chunk is unpacked once for all MR rows.
template <int MR, int NR, int BITS, typename S>
inline void quantized_block(const QuantizedArgs& a, int n, int m0) {
  const int k_all = a.k, gs = a.group_size, groups = k_all / gs;
  constexpr int per_chunk = BITS == 4 ? 2 * L : L;  // values in L bytes
  const int chunks = gs / per_chunk;
  const std::size_t row_bytes = static_cast<std::size_t>(k_all) * BITS / 8;
  const float* x = a.x + static_cast<std::size_t>(m0) * k_all;
  const float* xsum = a.xsum + static_cast<std::size_t>(m0) * groups;
  const WeightRows<NR, S> block(a, n, row_bytes, groups);
  const auto& [rows, scales, biases] = block;
  vf total[NR][MR] = {};
  float bias[NR][MR] = {};
  for (int g = 0; g < groups; ++g) {
    vf acc[NR][MR] = {};
    for (int c = 0; c < chunks; ++c) {
      const int k = g * gs + c * per_chunk;
      // Every weight row's chunk unpacked once, then each row of x loaded once for all of them.
      vf lo[NR], hi[NR];
      for (int r = 0; r < NR; ++r) {
        const vi u = load_bytes(rows[r] + k * BITS / 8);
        if constexpr (is_mxfp4<S>) {
          lo[r] = e2m1_values(u & 15);
          hi[r] = e2m1_values(u >> 4);
        } else if constexpr (BITS == 4) {
          lo[r] = to_vf(u & 15);
          hi[r] = to_vf(u >> 4);
        } else {
          lo[r] = to_vf(u);
        }
      }
      for (int m = 0; m < MR; ++m) {
        const vf x0 = load(x + m * k_all + k);
        // Separate statements: two FMAs (one expression compiles to a multiply, an FMA, an add).
        for (int r = 0; r < NR; ++r) acc[r][m] += lo[r] * x0;
        if constexpr (BITS == 4) {
          const vf x1 = load(x + m * k_all + k + L);
          for (int r = 0; r < NR; ++r) acc[r][m] += hi[r] * x1;
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float s = to_float(scales[r][g]);
      for (int m = 0; m < MR; ++m) total[r][m] += acc[r][m] * s;
      if constexpr (!is_mxfp4<S>) {
        const float b = to_float(biases[r][g]);
        for (int m = 0; m < MR; ++m) bias[r][m] += b * xsum[m * groups + g];
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] = hsum(total[r][m]) + bias[r][m];
}

#if defined(__AVX512F__) && LANES == 16
// 4 bits on AVX-512: each group's 16 possible weights, scale * q + bias, sit in one register, and
// a permute turns a chunk's nibbles into its weights at once. No conversion, no per-group scale
// multiply and no bias term: 6 vector instructions per 32 weights and row instead of 10.
template <int MR, int NR, typename S>
inline void quantized_block_lookup(const QuantizedArgs& a, int n, int m0) {
  const int k_all = a.k, gs = a.group_size, groups = k_all / gs;
  const int chunks = gs / (2 * L);
  const std::size_t row_bytes = static_cast<std::size_t>(k_all) / 2;
  const float* x = a.x + static_cast<std::size_t>(m0) * k_all;
  const WeightRows<NR, S> block(a, n, row_bytes, groups);
  const auto& [rows, scales, biases] = block;
  const std::size_t ahead = NR * row_bytes;
  // A group's weights are scale * q + bias, or for MXFP4 scale * (q's E2M1 value).
  const __m512 levels =
      is_mxfp4<S> ? _mm512_setr_ps(0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6)
                  : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  vf acc[NR][MR] = {};
  for (int g = 0; g < groups; ++g) {
    // The same bytes of the next block's rows: the hardware prefetcher alone left this loop
    // waiting on memory.
    for (int r = 0; r < NR; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(rows[r]) + ahead + g * gs / 2, _MM_HINT_T0);
    __m512 table[NR];
    for (int r = 0; r < NR; ++r) {
      if constexpr (is_mxfp4<S>)
        table[r] = _mm512_mul_ps(levels, _mm512_set1_ps(to_float(scales[r][g])));
      else
        table[r] = _mm512_fmadd_ps(levels, _mm512_set1_ps(to_float(scales[r][g])),
                                   _mm512_set1_ps(to_float(biases[r][g])));
    }
    for (int c = 0; c < chunks; ++c) {
      const int k = g * gs + c * 2 * L;
      vf lo[NR], hi[NR];
      for (int r = 0; r < NR; ++r) {
        const __m512i u =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + k / 2)));
        // vpermps reads the low 4 bits of each lane: the low nibble as it is, the high one shifted.
        lo[r] = (vf)_mm512_permutexvar_ps(u, table[r]);
        hi[r] = (vf)_mm512_permutexvar_ps(_mm512_srli_epi32(u, 4), table[r]);
      }
      for (int m = 0; m < MR; ++m) {
        const vf x0 = load(x + m * k_all + k), x1 = load(x + m * k_all + k + L);
        for (int r = 0; r < NR; ++r) acc[r][m] += lo[r] * x0;
        for (int r = 0; r < NR; ++r) acc[r][m] += hi[r] * x1;
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] = hsum(acc[r][m]);
}
#endif

template <int MR, int BITS, typename S>
inline void quantized_rows(const QuantizedArgs& a, int n0, int n1, int m0) {
  constexpr int NR = MR == 1 ? 4 : 2;
  int n = n0;
#if defined(__AVX512F__) && LANES == 16
  if constexpr (BITS == 4) {
    // 4 weight rows by up to 4 rows of x: 16 accumulators, 8 unpacked chunks, 4 tables.
    // One row of x (decoding) takes 6 weight rows a block: more rows in flight read faster
    // from memory than 4 (measured; 8 did no better).
    constexpr int NRL = MR == 1 ? 6 : 4;
    for (; n + NRL <= n1; n += NRL) quantized_block_lookup<MR, NRL, S>(a, n, m0);
    for (; n < n1; ++n) quantized_block_lookup<MR, 1, S>(a, n, m0);
    return;
  }
#endif
  for (; n + NR <= n1; n += NR) quantized_block<MR, NR, BITS, S>(a, n, m0);
  for (; n < n1; ++n) quantized_block<MR, 1, BITS, S>(a, n, m0);
}

// Rows of x in blocks of MR (up to MAX_ROWS), each block a template instance: body<MR>(m0).
template <int MAX_ROWS, typename Body>
inline void row_blocks(int rows, Body&& body) {
  int m = 0;
  for (; m + MAX_ROWS <= rows; m += MAX_ROWS) body.template operator()<MAX_ROWS>(m);
  const int rest = rows - m;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((rest == I + 1 ? (body.template operator()<I + 1>(m), 0) : 0), ...);
  }(std::make_integer_sequence<int, MAX_ROWS - 1>{});
}

// Weight rows a block of x rows runs over before the next block: their packed bytes stay in
// the core's L2 cache while every block of x passes over them (prefill, many rows of x).
constexpr int WEIGHT_ROWS_PER_PASS = 96;
// Rows of x one pass of the kernel carries in registers, against 4 weight rows on AVX-512 (16
// accumulators of its 32 registers), 2 elsewhere (16 registers).
constexpr int LOOKUP_ROWS = 4;

template <int BITS, typename S>
void quantized_gemv_typed(const QuantizedArgs& a, int n0, int n1) {
  for (int nb = n0; nb < n1; nb += WEIGHT_ROWS_PER_PASS) {
    const int ne = std::min(n1, nb + WEIGHT_ROWS_PER_PASS);
#if defined(__AVX512F__) && LANES == 16
    if constexpr (BITS == 4) {
      row_blocks<LOOKUP_ROWS>(a.rows, [&]<int MR>(int m) { quantized_rows<MR, BITS, S>(a, nb, ne, m); });
      continue;
    }
#endif
    row_blocks<4>(a.rows, [&]<int MR>(int m) { quantized_rows<MR, BITS, S>(a, nb, ne, m); });
  }
}

template <int BITS, typename S>
void quantized_dequantize_typed(const QuantizedArgs& a, int n0, int n1, float* tile) {
  const int k_all = a.k, gs = a.group_size, groups = k_all / gs;
  constexpr int per_chunk = BITS == 4 ? 2 * L : L;
  const int chunks = gs / per_chunk;
  const std::size_t row_bytes = static_cast<std::size_t>(k_all) * BITS / 8;
  for (int n = n0; n < n1; ++n) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(a.w) + static_cast<std::size_t>(n) * row_bytes;
    const S* scales = static_cast<const S*>(a.scales) + static_cast<std::size_t>(n) * groups;
    const S* biases =
        is_mxfp4<S> ? nullptr : static_cast<const S*>(a.biases) + static_cast<std::size_t>(n) * groups;
    float* out = tile + static_cast<std::size_t>(n - n0) * k_all;
    for (int g = 0; g < groups; ++g) {
      const vf s = vf{} + to_float(scales[g]);
      const vf b = vf{} + (is_mxfp4<S> ? 0.0f : to_float(biases[g]));
      for (int c = 0; c < chunks; ++c) {
        const int k = g * gs + c * per_chunk;
        const vi u = load_bytes(row + k * BITS / 8);
        if constexpr (is_mxfp4<S>) {
          store(out + k, e2m1_values(u & 15) * s);
          store(out + k + L, e2m1_values(u >> 4) * s);
        } else if constexpr (BITS == 4) {
          // The order of the prepared x: a chunk's even positions, then its odd ones.
          store(out + k, to_vf(u & 15) * s + b);
          store(out + k + L, to_vf(u >> 4) * s + b);
        } else {
          store(out + k, to_vf(u) * s + b);
        }
      }
    }
  }
}

#if defined(EXO_BF16_DOT)
// 4 bits by bf16 x on AVX512-BF16 CPUs (all of which have AVX512-VNNI), for decoding. 64 packed
// bytes are 32 words of 4 nibbles; shifting the words by 0, 4, 8 and 12 and masking gives 4
// vectors of 32 weights' q as 16-bit integers, and vpdpwssd multiplies each by 32 values of x
// (16-bit integers too, prepared in the same order by prepare_int_x) and adds pairs into 32-bit
// lanes, exactly. Per 128 weights: 3 shifts, 3 masks, 4 dot products. The bf16 dot products
// this replaced took a table lookup per vector and half as many products a cycle (measured).
// Each lane's sum is scaled in fp32 by its group's scale times its x's scale; the biases' term
// is the sum over groups of bias * sum of x.
template <int GS>
inline __m512 block_scales(const uint16_t* scales, int b) {
  // Lane l of a block's sums holds its values 8l..8l+7: group (8l) / GS of the block's 128 / GS.
  // The scales, bf16 in the odd words (fp32's high halves) of each lane.
  if constexpr (GS == 128) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(uint32_t{scales[b]} << 16)));
  }
  __m512i words, index;
  if constexpr (GS == 64) {
    uint32_t pair;
    std::memcpy(&pair, scales + 2 * b, 4);
    words = _mm512_set1_epi32(static_cast<int>(pair));
    index = _mm512_set_epi16(1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0,
                             0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  } else {
    uint64_t four;
    std::memcpy(&four, scales + 4 * b, 8);
    words = _mm512_set1_epi64(static_cast<long long>(four));
    index = _mm512_set_epi16(3, 0, 3, 0, 3, 0, 3, 0, 2, 0, 2, 0, 2, 0, 2, 0,
                             1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  }
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, index, words));
}

// How far ahead of the row being read one weight row at a time prefetches into L1 and into L2:
// the hardware prefetcher alone, or one 1 KiB row ahead, left the loop waiting on memory, and
// the second prefetch read faster than the first alone (measured).
constexpr std::size_t PREFETCH_AHEAD = 4096;
constexpr std::size_t L2_AHEAD = 3 * PREFETCH_AHEAD;

// The biases' term of a weight row's output: the sum over its groups of bias times x's sum.
inline float bias_term(const bf16* biases, const float* sums, int groups) {
  __m512 bias = _mm512_setzero_ps();
  int g = 0;
  for (; g + 16 <= groups; g += 16)
    bias = _mm512_fmadd_ps((__m512)load_bf16(&biases[g].bits), (__m512)load(sums + g), bias);
  float tail = 0.0f;
  for (; g < groups; ++g) tail += to_float(biases[g]) * sums[g];
  return _mm512_reduce_add_ps(bias) + tail;
}

template <int MR, int NR, int GS>
inline void nibble_dot_block(const QuantizedArgs& a, int n, int m0) {
  const int k_all = a.k, groups = k_all / GS, blocks = k_all / 128;
  const std::size_t row_bytes = static_cast<std::size_t>(k_all) / 2;
  const std::size_t lanes_per_row = static_cast<std::size_t>(k_all) / 8;  // 16 a block
  const int16_t* x = a.xq + static_cast<std::size_t>(m0) * k_all;
  const float* x_scales = a.xq_scales + static_cast<std::size_t>(m0) * lanes_per_row;
  const float* xsum = a.xsum + static_cast<std::size_t>(m0) * groups;
  const WeightRows<NR, bf16> block(a, n, row_bytes, groups);
  const auto& [rows, scales_in, biases_in] = block;
  const uint16_t* scales[NR];
  for (int r = 0; r < NR; ++r) scales[r] = &scales_in[r]->bits;
  // One row at a time reads the rows as one stream; a block of rows prefetches the next block's.
  const std::size_t ahead = NR == 1 ? PREFETCH_AHEAD : NR * row_bytes;
  const __m512i nibble = _mm512_set1_epi16(15);
  __m512 total[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) total[r][m] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* bytes = rows[r] + static_cast<std::size_t>(b) * 64;
      _mm_prefetch(reinterpret_cast<const char*>(bytes) + ahead, _MM_HINT_T0);
      // And into L2 further on, so that the near prefetch finds it there.
      if (NR == 1) _mm_prefetch(reinterpret_cast<const char*>(bytes) + L2_AHEAD, _MM_HINT_T1);
      const __m512i w = _mm512_loadu_si512(bytes);
      const __m512i q0 = _mm512_and_si512(w, nibble);
      const __m512i q1 = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
      const __m512i q2 = _mm512_and_si512(_mm512_srli_epi16(w, 8), nibble);
      const __m512i q3 = _mm512_srli_epi16(w, 12);
      const __m512 scale = block_scales<GS>(scales[r], b);
      for (int m = 0; m < MR; ++m) {
        const int16_t* xb =
            x + static_cast<std::size_t>(m) * k_all + static_cast<std::size_t>(b) * 128;
        __m512i sum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), q0, _mm512_loadu_si512(xb));
        sum = _mm512_dpwssd_epi32(sum, q1, _mm512_loadu_si512(xb + 32));
        sum = _mm512_dpwssd_epi32(sum, q2, _mm512_loadu_si512(xb + 64));
        sum = _mm512_dpwssd_epi32(sum, q3, _mm512_loadu_si512(xb + 96));
        const __m512 x_scale =
            _mm512_loadu_ps(x_scales + m * lanes_per_row + static_cast<std::size_t>(b) * 16);
        total[r][m] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, x_scale), total[r][m]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m)
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] =
          _mm512_reduce_add_ps(total[r][m]) +
          bias_term(biases_in[r], xsum + static_cast<std::size_t>(m) * groups, groups);
}

// x (bf16, rows of k values, k a multiple of 128) for nibble_dot_block: each 32 values scaled
// by their largest magnitude to at most 32767 and rounded to the nearest integer, so a value is
// off by at most max / 65534; in each block of 128, position 32 * j + i takes value 4 * i + j,
// the order in which the 16-bit words of 64 packed bytes hold their nibbles. `scales` gets 16
// floats a block, lane l the scale of the values that lane l of the sums holds (8l..8l+7): NaN
// where one of its 32 values is not finite, so that the output is too and is computed again
// the way MLX does it (see redo_non_finite).
void prepare_int_x(const uint16_t* x, int rows, int k, int16_t* xq, float* scales) {
  const std::size_t count = static_cast<std::size_t>(rows) * k;
  const __m512 largest = _mm512_set1_ps(3.4028235e38f);
  // Lane i of output j takes word 4 * (i % 16) + j of a pair of 32-word vectors.
  alignas(64) uint16_t index_words[4][32];
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 32; ++i) index_words[j][i] = static_cast<uint16_t>(4 * (i % 16) + j);
  for (std::size_t base = 0; base < count; base += 128) {
    __m512i words[4];  // the block's 128 values as integers, in their order
    alignas(16) float group_scale[4];
    for (int t = 0; t < 4; ++t) {
      const __m512 v0 = (__m512)load_bf16(x + base + 32 * t);
      const __m512 v1 = (__m512)load_bf16(x + base + 32 * t + 16);
      const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
      const bool finite = (_mm512_cmp_ps_mask(a0, largest, _CMP_NLE_UQ) |
                           _mm512_cmp_ps_mask(a1, largest, _CMP_NLE_UQ)) == 0;
      const float top = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
      // A group of zeros, or one whose largest magnitude is under 1e-34 (where 32767 / top
      // would overflow), counts as zeros.
      const bool usable = finite && top >= 1e-34f;
      const float step =
          !finite ? std::numeric_limits<float>::quiet_NaN() : usable ? top / 32767.0f : 0.0f;
      const __m512 inverse = _mm512_set1_ps(usable ? 32767.0f / top : 0.0f);
      group_scale[t] = step;
      const __m256i h0 = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inverse)));
      const __m256i h1 = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inverse)));
      words[t] = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
    }
    int16_t* out = xq + base;
    for (int j = 0; j < 4; ++j) {
      const __m512i index = _mm512_load_si512(index_words[j]);
      const __m512i low = _mm512_permutex2var_epi16(words[0], index, words[1]);
      const __m512i high = _mm512_permutex2var_epi16(words[2], index, words[3]);
      _mm512_storeu_si512(out + 32 * j, _mm512_mask_blend_epi16(0xFFFF0000u, low, high));
    }
    const __m512i lane_group = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512 four = _mm512_castps128_ps512(_mm_load_ps(group_scale));
    _mm512_storeu_ps(scales + base / 8, _mm512_permutexvar_ps(lane_group, four));
  }
}

#include "int8_gemv_impl.h"

// A row shorter than this many bytes shares a memory page with the next rows.
constexpr std::size_t PAGE_BYTES = 4096;

#include "byte_dot_impl.h"

template <int GS>
void nibble_dot_gemv(const QuantizedArgs& a, int n0, int n1) {
  // Weight rows shorter than a page are read one at a time, front to back: the hardware
  // prefetcher follows one stream through a page, and several rows read side by side within a
  // page left it behind.
  // Longer rows take 4 a block for several rows of x, which shares each unpacking.
  const bool short_rows = static_cast<std::size_t>(a.k) / 2 < PAGE_BYTES;
  for (int nb = n0; nb < n1; nb += WEIGHT_ROWS_PER_PASS) {
    const int ne = std::min(n1, nb + WEIGHT_ROWS_PER_PASS);
    row_blocks<LOOKUP_ROWS>(a.rows, [&]<int MR>(int m) {
      int n = nb;
      if (MR > 1 && !short_rows)
        for (; n + 4 <= ne; n += 4) nibble_dot_block<MR, 4, GS>(a, n, m);
      for (; n < ne; ++n) nibble_dot_block<MR, 1, GS>(a, n, m);
    });
  }
}
#endif

void quantized_gemv(const QuantizedArgs& a, int n0, int n1) {
#if defined(EXO_BF16_DOT)
  if (a.xb != nullptr) return byte_dot_gemv(a, n0, n1);
#endif
  if (a.mxfp4) return quantized_gemv_typed<4, e8m0>(a, n0, n1);
#if defined(EXO_BF16_DOT)
  if (a.xq8 != nullptr) {
    if (a.group_size == 32) return nibble_dot8_gemv<32>(a, n0, n1);
    if (a.group_size == 64) return nibble_dot8_gemv<64>(a, n0, n1);
    return nibble_dot8_gemv<128>(a, n0, n1);
  }
  if (a.xq != nullptr) {
    if (a.group_size == 32) return nibble_dot_gemv<32>(a, n0, n1);
    if (a.group_size == 64) return nibble_dot_gemv<64>(a, n0, n1);
    return nibble_dot_gemv<128>(a, n0, n1);
  }
#endif
  const bool four = a.bits == 4;
  switch (a.scale_type) {
    case Scalar::f32:
      return four ? quantized_gemv_typed<4, float>(a, n0, n1) : quantized_gemv_typed<8, float>(a, n0, n1);
    case Scalar::bf16:
      return four ? quantized_gemv_typed<4, bf16>(a, n0, n1) : quantized_gemv_typed<8, bf16>(a, n0, n1);
    case Scalar::f16:
      return four ? quantized_gemv_typed<4, f16>(a, n0, n1) : quantized_gemv_typed<8, f16>(a, n0, n1);
  }
}

void quantized_dequantize(const QuantizedArgs& a, int n0, int n1, float* tile) {
  if (a.mxfp4) return quantized_dequantize_typed<4, e8m0>(a, n0, n1, tile);
  const bool four = a.bits == 4;
  switch (a.scale_type) {
    case Scalar::f32:
      return four ? quantized_dequantize_typed<4, float>(a, n0, n1, tile)
                  : quantized_dequantize_typed<8, float>(a, n0, n1, tile);
    case Scalar::bf16:
      return four ? quantized_dequantize_typed<4, bf16>(a, n0, n1, tile)
                  : quantized_dequantize_typed<8, bf16>(a, n0, n1, tile);
    case Scalar::f16:
      return four ? quantized_dequantize_typed<4, f16>(a, n0, n1, tile)
                  : quantized_dequantize_typed<8, f16>(a, n0, n1, tile);
  }
}

// A weight of type H as stored: 16 bits for bf16 and fp16, a float for fp32.
template <typename H>
using Stored = std::conditional_t<std::is_same_v<H, float>, float, uint16_t>;

template <typename H>
inline const Stored<H>* weight_rows(const HalfArgs& a) {
  if constexpr (std::is_same_v<H, float>) return a.w32;
  else return a.w;
}
template <typename H>
inline vf load_weights(const Stored<H>* p) {
  if constexpr (std::is_same_v<H, float>) return load(p);
  else return load_half<H>(p);
}
template <typename H>
inline float weight_to_float(Stored<H> v) {
  if constexpr (std::is_same_v<H, float>) return v;
  else return half_to_float<H>(v);
}

// The lane sums of four vectors at once, [sum a, sum b, sum c, sum d]: halving pairs of them
// side by side takes about a third of the shuffles and adds of four trees (`hsum`), which a GEMV
// over short rows pays for every four outputs.
typedef float v4 __attribute__((vector_size(16)));
inline v4 hsum4(vf a, vf b, vf c, vf d) {
#if LANES == 16
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // [a a a a c c c c b b b b d d d d], each lane a sum of four of its vector's
  const vf q = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  const vf h = q + __builtin_shufflevector(q, q, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  const vf t = h + __builtin_shufflevector(h, h, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return __builtin_shufflevector(t, t, 0, 8, 4, 12);
#elif LANES == 8
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) +
                __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
  // [a a c c b b d d]
  const vf q = __builtin_shufflevector(ab, cd, 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(ab, cd, 2, 3, 10, 11, 6, 7, 14, 15);
  const vf t = q + __builtin_shufflevector(q, q, 1, 0, 3, 2, 5, 4, 7, 6);
  return __builtin_shufflevector(t, t, 0, 4, 2, 6);
#else
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 4, 5) + __builtin_shufflevector(a, b, 2, 3, 6, 7);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 4, 5) + __builtin_shufflevector(c, d, 2, 3, 6, 7);
  return __builtin_shufflevector(ab, cd, 0, 2, 4, 6) + __builtin_shufflevector(ab, cd, 1, 3, 5, 7);
#endif
}

template <int MR, int NR, typename H>
inline void half_block(const HalfArgs& a, int n, int m0) {
  const int k_all = a.k, k_vec = k_all - k_all % L;
  const float* x = a.x + static_cast<std::size_t>(m0) * k_all;
  const Stored<H>* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = weight_rows<H>(a) + static_cast<std::size_t>(n + r) * k_all;
  // The next block's rows follow these: asked for a line at a time while these are summed. A
  // small model's rows are short (the demo's 1 KiB), too short for the hardware prefetcher to
  // find its stride before the next block starts (the demo's weights come from L3 every step).
  const std::size_t ahead = static_cast<std::size_t>(NR) * k_all;
  constexpr int line = 64 / static_cast<int>(sizeof(Stored<H>));
  vf acc[NR][MR] = {};
  for (int k = 0; k < k_vec; k += L) {
    vf w[NR];
    for (int r = 0; r < NR; ++r) {
      if (k % line == 0) __builtin_prefetch(rows[r] + ahead + k);
      w[r] = load_weights<H>(rows[r] + k);
    }
    for (int m = 0; m < MR; ++m) {
      const vf xm = load(x + m * k_all + k);
      for (int r = 0; r < NR; ++r) acc[r][m] += w[r] * xm;
    }
  }
  for (int m = 0; m < MR; ++m) {
    float sums[NR];
    if constexpr (NR == 4) {
      const v4 s = hsum4(acc[0][m], acc[1][m], acc[2][m], acc[3][m]);
      for (int r = 0; r < NR; ++r) sums[r] = s[r];
    } else {
      for (int r = 0; r < NR; ++r) sums[r] = hsum(acc[r][m]);
    }
    for (int r = 0; r < NR; ++r) {
      for (int k = k_vec; k < k_all; ++k) sums[r] += x[m * k_all + k] * weight_to_float<H>(rows[r][k]);
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] = sums[r];
    }
  }
}

template <int MR, typename H>
inline void half_rows(const HalfArgs& a, int n0, int n1, int m0) {
  constexpr int NR = L == 16 || MR == 1 ? 4 : 2;
  int n = n0;
  for (; n + NR <= n1; n += NR) half_block<MR, NR, H>(a, n, m0);
  for (; n < n1; ++n) half_block<MR, 1, H>(a, n, m0);
}

template <typename H>
void half_gemv_typed(const HalfArgs& a, int n0, int n1) {
  // 16-bit rows are 4x the bytes of 4-bit ones (fp32 rows 8x): fewer fit the same L2 share.
  constexpr int per_pass = WEIGHT_ROWS_PER_PASS / (2 * static_cast<int>(sizeof(Stored<H>)));
  for (int nb = n0; nb < n1; nb += per_pass) {
    const int ne = std::min(n1, nb + per_pass);
    row_blocks<LOOKUP_ROWS>(a.rows, [&]<int MR>(int m) { half_rows<MR, H>(a, nb, ne, m); });
  }
}

#if defined(EXO_BF16_DOT)
// bf16 weights by bf16 x on AVX512-BF16: vdpbf16ps takes 32 pairs of each per instruction.
template <int MR, int NR>
inline void dot_block(const HalfArgs& a, int n, int m0) {
  const int k_all = a.k, k_vec = k_all - k_all % 32;
  const uint16_t* x = a.x16 + static_cast<std::size_t>(m0) * k_all;
  const uint16_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = a.w + static_cast<std::size_t>(n + r) * k_all;
  const std::size_t ahead = static_cast<std::size_t>(NR) * k_all;  // the next block's rows
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int k = 0; k < k_vec; k += 32) {
    __m512bh w[NR];
    for (int r = 0; r < NR; ++r) {
      if (k % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k), _MM_HINT_T0);
      w[r] = (__m512bh)_mm512_loadu_si512(rows[r] + k);
    }
    for (int m = 0; m < MR; ++m) {
      const __m512bh xm = (__m512bh)_mm512_loadu_si512(x + static_cast<std::size_t>(m) * k_all + k);
      for (int r = 0; r < NR; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], w[r], xm);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float s = _mm512_reduce_add_ps(acc[r][m]);
      for (int k = k_vec; k < k_all; ++k)
        s += bf16_to_float(x[static_cast<std::size_t>(m) * k_all + k]) * bf16_to_float(rows[r][k]);
      a.out[static_cast<std::size_t>(m0 + m) * a.ldo + n + r] = s;
    }
}

constexpr int PAGE_VALUES = 2048;  // 16-bit values in a 4 KiB page

// One row of x: one weight row at a time, with four chains over k. A single stream per
// core reads faster than four rows side by side, and four chains hide vdpbf16ps's latency.
inline void dot_row(const HalfArgs& a, int n, int m) {
  const int k_all = a.k;
  const uint16_t* x = a.x16 + static_cast<std::size_t>(m) * k_all;
  const uint16_t* row = a.w + static_cast<std::size_t>(n) * k_all;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();
  int k = 0;
  // A page at a time, first asking for the next page's first lines: the hardware prefetcher
  // does not cross a page, so each page of the stream (each row, at k = 2048) would start with
  // a wait on memory.
  for (int page = 0; page < k_all; page += PAGE_VALUES) {
    for (int line = 0; line < 4; ++line)
      _mm_prefetch(reinterpret_cast<const char*>(row + page + PAGE_VALUES) + 64 * line,
                   _MM_HINT_T0);
    const int end = std::min(k_all, page + PAGE_VALUES);
    for (; k + 128 <= end; k += 128) {
      acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(row + k),
                              (__m512bh)_mm512_loadu_si512(x + k));
      acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)_mm512_loadu_si512(row + k + 32),
                              (__m512bh)_mm512_loadu_si512(x + k + 32));
      acc2 = _mm512_dpbf16_ps(acc2, (__m512bh)_mm512_loadu_si512(row + k + 64),
                              (__m512bh)_mm512_loadu_si512(x + k + 64));
      acc3 = _mm512_dpbf16_ps(acc3, (__m512bh)_mm512_loadu_si512(row + k + 96),
                              (__m512bh)_mm512_loadu_si512(x + k + 96));
    }
  }
  for (; k + 32 <= k_all; k += 32)
    acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512(row + k), (__m512bh)_mm512_loadu_si512(x + k));
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
  for (; k < k_all; ++k) s += bf16_to_float(x[k]) * bf16_to_float(row[k]);
  a.out[static_cast<std::size_t>(m) * a.ldo + n] = s;
}

template <int MR>
inline void dot_rows(const HalfArgs& a, int n0, int n1, int m0) {
  int n = n0;
  if constexpr (MR == 1) {
    for (; n < n1; ++n) dot_row(a, n, m0);
    return;
  }
  for (; n + 4 <= n1; n += 4) dot_block<MR, 4>(a, n, m0);
  for (; n < n1; ++n) dot_block<MR, 1>(a, n, m0);
}
#endif

void half_gemv(const HalfArgs& a, int n0, int n1) {
#if defined(EXO_BF16_DOT)
  if (a.x16 != nullptr && a.w_type == Scalar::bf16) {
    for (int nb = n0; nb < n1; nb += WEIGHT_ROWS_PER_PASS / 4) {
      const int ne = std::min(n1, nb + WEIGHT_ROWS_PER_PASS / 4);
      row_blocks<LOOKUP_ROWS>(a.rows, [&]<int MR>(int m) { dot_rows<MR>(a, nb, ne, m); });
    }
    return;
  }
#endif
  if (a.w_type == Scalar::bf16) half_gemv_typed<bf16>(a, n0, n1);
  else if (a.w_type == Scalar::f32) half_gemv_typed<float>(a, n0, n1);
  else half_gemv_typed<f16>(a, n0, n1);
}

void half_widen(const HalfArgs& a, int n0, int n1, float* tile) {
  const std::size_t count = static_cast<std::size_t>(n1 - n0) * a.k;
  const uint16_t* in = a.w + static_cast<std::size_t>(n0) * a.k;
  std::size_t i = 0;
  if (a.w_type == Scalar::bf16) {
    for (; i + L <= count; i += L) store(tile + i, load_bf16(in + i));
    for (; i < count; ++i) tile[i] = bf16_to_float(in[i]);
  } else {
    for (; i + L <= count; i += L) store(tile + i, load_f16(in + i));
    for (; i < count; ++i) tile[i] = f16_to_float(in[i]);
  }
}

void to_f32(const void* in, Scalar type, std::size_t count, float* out) {
  const uint16_t* h = static_cast<const uint16_t*>(in);
  std::size_t i = 0;
  switch (type) {
    case Scalar::f32: std::memcpy(out, in, count * sizeof(float)); return;
    case Scalar::bf16:
      for (; i + L <= count; i += L) store(out + i, load_bf16(h + i));
      for (; i < count; ++i) out[i] = bf16_to_float(h[i]);
      return;
    case Scalar::f16:
      for (; i + L <= count; i += L) store(out + i, load_f16(h + i));
      for (; i < count; ++i) out[i] = f16_to_float(h[i]);
      return;
  }
}

void from_f32(const float* in, Scalar type, std::size_t count, void* out) {
  uint16_t* h = static_cast<uint16_t*>(out);
  switch (type) {
    case Scalar::f32: std::memcpy(out, in, count * sizeof(float)); return;
    case Scalar::bf16: {
      std::size_t i = 0;
      // float_to_bf16 on L values at once (the scalar loop was a share of each small product).
      for (; i + L <= count; i += L) {
        vu u;
        std::memcpy(&u, in + i, sizeof(u));
        const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const vu nan = (u >> 16) | 0x40u;
        const vu bits = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
        const vh half = __builtin_convertvector(bits, vh);
        std::memcpy(h + i, &half, sizeof(half));
      }
      for (; i < count; ++i) h[i] = float_to_bf16(in[i]);
      return;
    }
    case Scalar::f16: {
      std::size_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= count; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < count; ++i) h[i] = float_to_f16(in[i]);
      return;
    }
  }
}

#include "elementwise_impl.h"
#include "attention_impl.h"

}  // namespace
}  // namespace ISA_NS

extern const Isa ISA_TABLE;
const Isa ISA_TABLE = {
    ISA_NAME,
    ISA_NS::L,
#if defined(EXO_BF16_DOT)
    true,
#else
    false,
#endif
    ISA_NS::quantized_gemv,
#if defined(EXO_BF16_DOT)
    ISA_NS::prepare_int_x,
    ISA_NS::prepare_int8_x,
    ISA_NS::prepare_byte_x,
#else
    nullptr,
    nullptr,
    nullptr,
#endif
    ISA_NS::half_gemv,
    ISA_NS::quantized_dequantize,
    ISA_NS::half_widen,
    ISA_NS::decode_attention,
    ISA_NS::silu_mul,
    ISA_NS::logsumexp_rows,
    ISA_NS::argmax_rows,
    ISA_NS::to_f32,
    ISA_NS::from_f32,
};

}  // namespace exo_kernels
