// A few rows of bf16 x (several requests decoding at once) by 4-bit weights on AMX's 8-bit
// tiles (TDPBSUD). x is rounded to 8-bit integers per 64 values, as the 8-bit GEMV rounds it
// (int8_quantize.h, shared with it), and is the A tile: a row of x a tile row. The weights' nibbles,
// unsigned bytes as they are, are the B tile: 16 weight rows by 64 values, each tile row 4
// values of every weight row. One product then gives every row of x against 16 weight rows, and
// its sums come out a row of x at a time, 16 weight rows across: scaling them costs a few
// instructions a row of x, not a few a weight row, and they go out as they are.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "amx.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace exo_kernels {

std::size_t amx_int8_x_bytes(int k, int rows) {
  return static_cast<std::size_t>(k) * rows;
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)

namespace {
#include "int8_quantize.h"
}  // namespace

bool amx_int8_available() {
  static const bool available = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ((d >> 25) & 1) && amx_available();
  }();
  return available;
}

void amx_int8_prepare_x(const uint16_t* x, int rows, int k, int8_t* prepared, float* steps,
                        float* sums) {
  const int blocks = k / 64;
  std::fill(steps, steps + static_cast<std::size_t>(blocks) * 16, 0.0f);
  std::fill(sums, sums + static_cast<std::size_t>(blocks) * 16, 0.0f);
  // Dword 2d of a prepared row: the even values 8d..8d+6, dword 2d + 1 the odd ones.
  const __m512i interleave = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                              16, 0);
  for (int m = 0; m < rows; ++m)
    for (int b = 0; b < blocks; ++b) {
      const Int8Block q = quantize_64(x + static_cast<std::size_t>(m) * k + 64 * b);
      const __m512i integers[4] = {q.even[0], q.even[1], q.odd[0], q.odd[1]};
      __m128i bytes[4];
      __m512i total = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i) {
        total = _mm512_add_epi32(total, integers[i]);
        bytes[i] = _mm512_cvtsepi32_epi8(integers[i]);
      }
      const __m512i even = _mm512_castsi256_si512(_mm256_set_m128i(bytes[1], bytes[0]));
      const __m512i odd = _mm512_castsi256_si512(_mm256_set_m128i(bytes[3], bytes[2]));
      _mm512_storeu_si512(prepared + (static_cast<std::size_t>(b) * rows + m) * 64,
                          _mm512_permutex2var_epi32(even, interleave, odd));
      steps[b * 16 + m] = q.step;
      sums[b * 16 + m] = static_cast<float>(_mm512_reduce_add_epi32(total)) * q.step;
    }
}

namespace {

// 64 values (32 packed bytes) of 16 weight rows `row_bytes` apart as one B tile. Tile row 2d
// holds, for each weight row, the low nibbles of its packed dword d (values 8d, 8d+2, 8d+4,
// 8d+6), row 2d + 1 their high nibbles (the odd values): x's order. The dwords are transposed
// 8 by 8 in each half of the vectors (rows 0-7 in the low half, 8-15 in the high), then a mask
// and a shift unpack each.
inline void unpack_block(const uint8_t* rows, std::size_t row_bytes, int block, uint8_t* out) {
  __m512i v[8];
  for (int i = 0; i < 8; ++i) {
    const uint8_t* src = rows + i * row_bytes + 32 * block;
    // The next 16 rows' lines at this place, once a line: 16 rows read side by side leave the
    // hardware prefetcher behind.
    if ((block & 1) == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(src) + 16 * row_bytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(src) + 24 * row_bytes, _MM_HINT_T0);
    }
    v[i] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8 * row_bytes)), 1);
  }
  __m512i t[8], u[8];
  for (int h = 0; h < 8; h += 4) {
    t[h] = _mm512_unpacklo_epi32(v[h], v[h + 1]);
    t[h + 1] = _mm512_unpackhi_epi32(v[h], v[h + 1]);
    t[h + 2] = _mm512_unpacklo_epi32(v[h + 2], v[h + 3]);
    t[h + 3] = _mm512_unpackhi_epi32(v[h + 2], v[h + 3]);
    // u[h + j], 128-bit part L: dword 4L + j of the four rows.
    u[h] = _mm512_unpacklo_epi64(t[h], t[h + 2]);
    u[h + 1] = _mm512_unpackhi_epi64(t[h], t[h + 2]);
    u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
    u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
  }
  const __m512i first = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
  const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
  const __m512i nibble = _mm512_set1_epi8(15);
  for (int j = 0; j < 4; ++j)
    for (int half = 0; half < 2; ++half) {
      const int d = 4 * half + j;  // dword d of every weight row
      const __m512i dwords = _mm512_permutex2var_epi64(u[j], half ? second : first, u[4 + j]);
      _mm512_store_si512(out + 64 * (2 * d), _mm512_and_si512(dwords, nibble));
      _mm512_store_si512(out + 64 * (2 * d + 1),
                         _mm512_and_si512(_mm512_srli_epi16(dwords, 4), nibble));
    }
}

// Block b's tile product on C tile T, A tile 2 + T, B tile 4 + T (the tile intrinsics take their
// tile's number as a literal).
template <int T>
inline void multiply_block(const int8_t* x_block, const uint8_t* b) {
  if constexpr (T == 0) {
    _tile_zero(0);
    _tile_loadd(2, x_block, 64);
    _tile_loadd(4, b, 64);
    _tile_dpbsud(0, 2, 4);
  } else {
    _tile_zero(1);
    _tile_loadd(3, x_block, 64);
    _tile_loadd(5, b, 64);
    _tile_dpbsud(1, 3, 5);
  }
}

// A block's sums (C: [row of x][weight row]) scaled into each row of x's totals, 16 weight rows
// across: q . x times x's step and the weights' scale, plus the bias times x's sum.
inline void apply_block(const int32_t (*sum)[16], const float* step_of, const float* sum_of,
                        __m512 scale, __m512 bias, int rows, __m512* total) {
  for (int m = 0; m < rows; ++m) {
    const __m512 products = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sum[m])),
                                          _mm512_set1_ps(step_of[m]));
    total[m] = _mm512_fmadd_ps(products, scale, total[m]);
    total[m] = _mm512_fmadd_ps(bias, _mm512_set1_ps(sum_of[m]), total[m]);
  }
}

// 16 weight rows from n, PER blocks of 64 values a group; scale32 and bias32 their scales and
// biases as [weight row][group]. Each block: its tile product (C tile 0 for even blocks, 1 for
// odd), stored, then scaled in fp32 one block later, while the tiles work on the next. Blocks
// are unpacked two ahead of the tiles (a ring of 4), so a tile never loads what the stores
// have just written.
template <int PER>
void int8_block(const int8_t* prepared, const float* steps, const float* sums, int rows, int k,
                const uint8_t* w, const float* scale32, const float* bias32, int n, float* out,
                int ldo) {
  const int blocks = k / 64, groups = blocks / PER;
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const std::size_t x_block = static_cast<std::size_t>(64) * rows;
  alignas(64) uint8_t b_tiles[4][16 * 64];
  alignas(64) int32_t c[2][16][16];
  __m512 total[16];
  for (int m = 0; m < rows; ++m) total[m] = _mm512_setzero_ps();
  // Lane r: where weight row r's value of group 0 is.
  const __m512i row_at = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(groups));
  auto apply = [&](int b, const int32_t (*sum)[16]) {
    const __m512i at = _mm512_add_epi32(row_at, _mm512_set1_epi32(b / PER));
    apply_block(sum, steps + 16 * b, sums + 16 * b, _mm512_i32gather_ps(at, scale32, 4),
                _mm512_i32gather_ps(at, bias32, 4), rows, total);
  };
  for (int b = 0; b < std::min(2, blocks); ++b) unpack_block(w, row_bytes, b, b_tiles[b]);
  // blocks is a multiple of 4 (k % 256 == 0): two blocks a pass, one on each C tile.
  for (int b = 0; b < blocks; b += 2) {
    multiply_block<0>(prepared + b * x_block, b_tiles[b & 3]);
    if (b + 2 < blocks) unpack_block(w, row_bytes, b + 2, b_tiles[(b + 2) & 3]);
    if (b > 0) apply(b - 1, c[1]);
    _tile_stored(0, c[0], 64);
    multiply_block<1>(prepared + (b + 1) * x_block, b_tiles[(b + 1) & 3]);
    if (b + 3 < blocks) unpack_block(w, row_bytes, b + 3, b_tiles[(b + 3) & 3]);
    apply(b, c[0]);
    _tile_stored(1, c[1], 64);
  }
  apply(blocks - 1, c[1]);
  for (int m = 0; m < rows; ++m)
    _mm512_storeu_ps(out + static_cast<std::size_t>(m) * ldo + n, total[m]);
}

}  // namespace

void amx_int8_gemv(const int8_t* prepared, const float* steps, const float* sums, int rows,
                   int k, const uint32_t* w, const void* scales, const void* biases,
                   int scale_type, int group_size, int n0, int n1, float* out, int ldo) {
  // x (A: tiles 2, 3) and the sums (C: 0, 1) a tile row a row of x; the weights (B: 4, 5) 16
  // rows of 4 values of each of 16 weight rows.
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette = 1;
  for (int t : {0, 1, 2, 3, 4, 5}) {
    config.rows[t] = static_cast<uint8_t>(t >= 4 ? 16 : rows);
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
  const int groups = k / group_size;
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  thread_local std::vector<float> scale32, bias32;
  scale32.resize(static_cast<std::size_t>(16) * groups);
  bias32.resize(static_cast<std::size_t>(16) * groups);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
  for (int n = n0; n < n1; n += 16) {
    const std::size_t first = static_cast<std::size_t>(n) * groups;
    amx_widen_rows(scales, scale_type, first, scale32.size(), scale32.data());
    amx_widen_rows(biases, scale_type, first, bias32.size(), bias32.data());
    const uint8_t* block = bytes + static_cast<std::size_t>(n) * row_bytes;
    if (group_size == 64)
      int8_block<1>(prepared, steps, sums, rows, k, block, scale32.data(), bias32.data(), n, out,
                    ldo);
    else
      int8_block<2>(prepared, steps, sums, rows, k, block, scale32.data(), bias32.data(), n, out,
                    ldo);
  }
  _tile_release();
}

#else

bool amx_int8_available() { return false; }
void amx_int8_prepare_x(const uint16_t*, int, int, int8_t*, float*, float*) {}
void amx_int8_gemv(const int8_t*, const float*, const float*, int, int, const uint32_t*,
                   const void*, const void*, int, int, int, int, float*, int) {}

#endif

}  // namespace exo_kernels
