#include "amx.h"

#include <cstring>
#include <tuple>
#include <vector>

#include "half_bits.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace exo_kernels {

bool amx_enabled = true;

std::size_t amx_x_size(int rows, int k) {
  const std::size_t padded = (static_cast<std::size_t>(rows) + 31) / 32 * 32;
  return padded * k;
}

// Per tile of 16 rows of x and per 32 values of k, one 1 KiB block: row kk holds, for each of
// the 16 rows m, the pair x[m][2kk], x[m][2kk+1] (the tiles' "VNNI" layout for B). Rows past
// `rows` are zero.
void amx_prepare_x(const uint16_t* x, int rows, int k, uint16_t* prepared, bool nibble_order) {
  const int tiles = (rows + 31) / 32 * 2, steps = k / 32;
  // Where position p of the prepared order comes from.
  auto source = [nibble_order](int p) {
    if (!nibble_order) return p;
    const int j = p % 64;
    return p - j + (j < 32 ? 2 * j : 2 * (j - 32) + 1);
  };
  for (int t = 0; t < tiles; ++t)
    for (int s = 0; s < steps; ++s) {
      uint16_t* block = prepared + (static_cast<std::size_t>(t) * steps + s) * 512;
      for (int mm = 0; mm < 16; ++mm) {
        const int m = t * 16 + mm;
        const uint16_t* row = x + static_cast<std::size_t>(m) * k;
        for (int kk = 0; kk < 16; ++kk) {
          block[kk * 32 + 2 * mm] = m < rows ? row[source(s * 32 + 2 * kk)] : 0;
          block[kk * 32 + 2 * mm + 1] = m < rows ? row[source(s * 32 + 2 * kk + 1)] : 0;
        }
      }
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

namespace {

constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr long XFEATURE_XTILEDATA = 18;

// Eight tiles of 16 rows by 64 bytes: C at 0-3 (two weight tiles by two x tiles, fp32), the
// weights' A at 4-5, x's B at 6-7.
void configure() {
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  _tile_loadconfig(&config);
}

// c = (a0; a1) by (b0, b1) over the k steps [s0, s1): tiles 0-3 zeroed, multiplied, stored.
// a0 and a1 are 16 weight rows each (`stride` bytes apart); b0 and b1 two tiles of prepared x.
void multiply_tiles(const uint16_t* a0, const uint16_t* a1, long stride, const uint16_t* b0,
                    const uint16_t* b1, int s0, int s1, float (*c)[16][16]) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int s = s0; s < s1; ++s) {
    _tile_loadd(4, a0 + s * 32, stride);
    _tile_loadd(5, a1 + s * 32, stride);
    _tile_loadd(6, b0 + s * 512, 64);
    _tile_loadd(7, b1 + s * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

// c[tile][weight row][x row] of weight rows n.. and x rows 32p.. to out[x row][weight row].
void scatter(const float (*c)[16][16], int n, int p, int rows, float* out, int ldo) {
  for (int t = 0; t < 4; ++t) {
    const int nb = n + (t / 2) * 16, mb = p * 32 + (t % 2) * 16;
    for (int mm = 0; mm < 16 && mb + mm < rows; ++mm)
      for (int nn = 0; nn < 16; ++nn)
        out[static_cast<std::size_t>(mb + mm) * ldo + nb + nn] = c[t][nn][mm];
  }
}

}  // namespace

bool amx_available() {
  static const bool available = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    // Linux hands out the tiles' state only to a process that asks for it.
    return tile && bf16 && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return available;
}

void amx_half_gemm(const uint16_t* prepared, int rows, int k, const uint16_t* w, int n0, int n1,
                   float* out, int ldo) {
  configure();
  const int steps = k / 32, pairs = (rows + 31) / 32;
  const long stride = static_cast<long>(k) * 2;
  alignas(64) float c[4][16][16];
  // The weight rows outside, so a pair of weight tiles stays in L2 while every pair of x
  // tiles passes over it, and the weights come from memory once.
  for (int n = n0; n < n1; n += 32) {
    const uint16_t* w0 = w + static_cast<std::size_t>(n) * k;
    const uint16_t* w1 = w0 + static_cast<std::size_t>(16) * k;
    for (int p = 0; p < pairs; ++p) {
      const uint16_t* b0 = prepared + static_cast<std::size_t>(2 * p) * steps * 512;
      const uint16_t* b1 = b0 + static_cast<std::size_t>(steps) * 512;
      multiply_tiles(w0, w1, stride, b0, b1, 0, steps, c);
      scatter(c, n, p, rows, out, ldo);
    }
  }
  _tile_release();
}

namespace {

float scale_at(const void* scales, int type, std::size_t i) {
  const uint16_t* h = static_cast<const uint16_t*>(scales);
  switch (type) {
    case 1: return bf16_to_float(h[i]);
    case 2: return f16_to_float(h[i]);
    default: return static_cast<const float*>(scales)[i];
  }
}

// 32 weight rows' q (0-15) as bf16, row by row, each chunk of 64 as its low nibbles then its
// high ones (the order of the prepared x).
void unpack_rows(const uint8_t* w, int k, uint16_t* q) {
  alignas(64) static const uint16_t levels_bits[32] = {
      0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120,
      0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0,
      0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
  const __m512i levels = _mm512_load_si512(levels_bits);
  const __m512i nibble = _mm512_set1_epi16(0x0f);
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < k; c += 64) {
      const __m512i bytes = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * row_bytes + c / 2)));
      uint16_t* out = q + static_cast<std::size_t>(r) * k + c;
      _mm512_storeu_si512(out, _mm512_permutexvar_epi16(_mm512_and_si512(bytes, nibble), levels));
      _mm512_storeu_si512(out + 32,
                          _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), levels));
    }
}

}  // namespace

void amx_quantized_gemm(const uint16_t* prepared, int rows, int k, const uint32_t* w,
                        const void* scales, int scale_type, int group_size, int n0, int n1,
                        float* out, int ldo) {
  configure();
  const int steps = k / 32, pairs = (rows + 31) / 32, groups = k / group_size;
  const int steps_per_group = group_size / 32;
  const long stride = static_cast<long>(k) * 2;
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  thread_local std::vector<uint16_t> q;
  q.resize(static_cast<std::size_t>(32) * k);
  alignas(64) float c[4][16][16];
  alignas(64) float total[4][16][16];
  for (int n = n0; n < n1; n += 32) {
    unpack_rows(reinterpret_cast<const uint8_t*>(w) + n * row_bytes, k, q.data());
    const uint16_t* a0 = q.data();
    const uint16_t* a1 = a0 + static_cast<std::size_t>(16) * k;
    for (int p = 0; p < pairs; ++p) {
      const uint16_t* b0 = prepared + static_cast<std::size_t>(2 * p) * steps * 512;
      const uint16_t* b1 = b0 + static_cast<std::size_t>(steps) * 512;
      std::memset(total, 0, sizeof(total));
      for (int g = 0; g < groups; ++g) {
        multiply_tiles(a0, a1, stride, b0, b1, g * steps_per_group, (g + 1) * steps_per_group, c);
        for (int t = 0; t < 4; ++t)
          for (int nn = 0; nn < 16; ++nn) {
            const int row = n + (t / 2) * 16 + nn;
            const __m512 scale =
                _mm512_set1_ps(scale_at(scales, scale_type, static_cast<std::size_t>(row) * groups + g));
            _mm512_store_ps(total[t][nn], _mm512_fmadd_ps(_mm512_load_ps(c[t][nn]), scale,
                                                          _mm512_load_ps(total[t][nn])));
          }
      }
      scatter(total, n, p, rows, out, ldo);
    }
  }
  _tile_release();
}


std::size_t amx_small_x_size(int k, int rows) {
  return static_cast<std::size_t>(k) / 32 * 32 * rows;
}

void amx_prepare_small_x(const uint16_t* x, int rows, int k, uint16_t* prepared) {
  // Position i of a chunk takes value 4 (i % 8) + i / 8; its pair lands in row i / 2 of the
  // chunk's tile, in column m. A tile's rows are `rows` pairs wide, packed: x for a whole
  // product then stays in L1 for the few rows this serves.
  alignas(64) uint16_t order[32];
  alignas(64) int32_t slots[16];
  for (int i = 0; i < 32; ++i) order[i] = static_cast<uint16_t>(4 * (i % 8) + i / 8);
  for (int kk = 0; kk < 16; ++kk) slots[kk] = kk * rows;
  const __m512i index = _mm512_load_si512(order);
  const __m512i rows_of_tile = _mm512_load_si512(slots);
  for (int m = 0; m < rows; ++m) {
    const uint16_t* row = x + static_cast<std::size_t>(m) * k;
    const __m512i column = _mm512_add_epi32(rows_of_tile, _mm512_set1_epi32(m));
    for (int c = 0; c < k / 32; ++c) {
      const __m512i values = _mm512_loadu_si512(row + 32 * c);
      _mm512_i32scatter_epi32(prepared + static_cast<std::size_t>(c) * 32 * rows, column,
                              _mm512_permutexvar_epi16(index, values), 4);
    }
  }
}

void amx_widen_rows(const void* values, int type, std::size_t first, std::size_t count, float* out) {
  const uint16_t* h = static_cast<const uint16_t*>(values) + first;
  if (type == 0) {
    std::memcpy(out, static_cast<const float*>(values) + first, count * sizeof(float));
  } else if (type == 1) {
    std::size_t i = 0;
    for (; i + 16 <= count; i += 16) {
      const __m512i words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
      _mm512_storeu_si512(out + i, _mm512_slli_epi32(words, 16));
    }
    for (; i < count; ++i) out[i] = bf16_to_float(h[i]);
  } else {
    std::size_t i = 0;
    for (; i + 16 <= count; i += 16)
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
    for (; i < count; ++i) out[i] = f16_to_float(h[i]);
  }
}

namespace {

// Each 16 bytes of a weight row broadcast to the four 128-bit lanes; lane q shifted right by 4q
// brings its words' nibble q low (position i of the chunk: value 4 (i % 8) + i / 8), and a
// lookup in the 16 levels gives q exactly in bf16.
struct Unpacker {
  __m512i levels, shifts;
  Unpacker() {
    alignas(64) static const uint16_t levels_bits[32] = {
        0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120,
        0x4130, 0x4140, 0x4150, 0x4160, 0x4170, 0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0,
        0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170};
    levels = _mm512_load_si512(levels_bits);
    shifts = _mm512_set_epi16(12, 12, 12, 12, 12, 12, 12, 12, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4,
                              4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
  }
  // Chunk `chunk` (32 values) of 16 rows `row_bytes` apart into 16 rows of 32 bf16.
  void operator()(const uint8_t* rows, std::size_t row_bytes, int chunk, uint16_t* out) const {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* src = rows + r * row_bytes + chunk * 16;
      // The next block's line at this place, once a line: 16 rows read side by side left the
      // hardware prefetcher behind.
      if ((chunk & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(src) + 16 * row_bytes, _MM_HINT_T0);
      const __m512i words =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
      _mm512_store_si512(out + r * 32, _mm512_permutexvar_epi16(_mm512_srlv_epi16(words, shifts), levels));
    }
  }
};

// 16 weight rows from n: every group's q . x on a C tile (tile 0 for even groups, 1 for odd),
// stored, then scaled in fp32 one group later, while the tiles work on the next one. Chunks
// are unpacked two ahead of the tiles, so a tile never loads what the stores have just written.
template <int CPG>
void small_block(const Unpacker& unpack, const uint16_t* prepared, const float* xsum_t, int rows,
                 int k, const uint8_t* w, const float* scale32, const float* bias32, int n,
                 float* out, int ldo) {
  const int chunks = k / 32, groups = chunks / CPG;
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  alignas(64) uint16_t a[4][16 * 32];
  alignas(64) float c[2][16][16] = {};
  __m512 total[16];
  for (int r = 0; r < 16; ++r) total[r] = _mm512_setzero_ps();
  unpack(w, row_bytes, 0, a[0]);
  if (chunks > 1) unpack(w, row_bytes, 1, a[1]);
  auto run = [&]<int T>(int g) {
    // The tile intrinsics take their tile's number as a literal.
    if constexpr (T == 0) _tile_zero(0); else _tile_zero(1);
    for (int i = 0; i < CPG; ++i) {
      const int chunk = g * CPG + i;
      if (chunk + 2 < chunks) unpack(w, row_bytes, chunk + 2, a[(chunk + 2) & 3]);
      // Even chunks in tiles 2 and 4, odd ones in 3 and 5: a load into the tile the last
      // product still reads would wait for it.
      const uint16_t* x_chunk = prepared + static_cast<std::size_t>(chunk) * 32 * rows;
      if (chunk & 1) {
        _tile_loadd(3, a[chunk & 3], 64);
        _tile_loadd(5, x_chunk, 4 * rows);
        if constexpr (T == 0) _tile_dpbf16ps(0, 3, 5); else _tile_dpbf16ps(1, 3, 5);
      } else {
        _tile_loadd(2, a[chunk & 3], 64);
        _tile_loadd(4, x_chunk, 4 * rows);
        if constexpr (T == 0) _tile_dpbf16ps(0, 2, 4); else _tile_dpbf16ps(1, 2, 4);
      }
    }
    if constexpr (T == 0) _tile_stored(0, c[0], 64); else _tile_stored(1, c[1], 64);
  };
  auto apply = [&](int g, const float (*sums)[16]) {
    const __m512 xs = _mm512_loadu_ps(xsum_t + static_cast<std::size_t>(g) * 16);
    for (int r = 0; r < 16; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * groups + g;
      total[r] = _mm512_fmadd_ps(_mm512_set1_ps(bias32[at]), xs, total[r]);
      total[r] = _mm512_fmadd_ps(_mm512_load_ps(sums[r]), _mm512_set1_ps(scale32[at]), total[r]);
    }
  };
  for (int g = 0; g < groups; g += 2) {
    run.template operator()<0>(g);
    if (g > 0) apply(g - 1, c[1]);
    if (g + 1 < groups) run.template operator()<1>(g + 1);
    apply(g, c[0]);
  }
  if (groups % 2 == 0) apply(groups - 1, c[1]);
  alignas(64) float t[16][16];
  for (int r = 0; r < 16; ++r) _mm512_store_ps(t[r], total[r]);
  for (int m = 0; m < rows; ++m)
    for (int r = 0; r < 16; ++r) out[static_cast<std::size_t>(m) * ldo + n + r] = t[r][m];
}

}  // namespace

void amx_quantized_gemv(const uint16_t* prepared, const float* xsum_t, int rows, int k,
                        const uint32_t* w, const void* scales, const void* biases, int scale_type,
                        int group_size, int n0, int n1, float* out, int ldo) {
  // C (tiles 0, 1) and x (tiles 4, 5) only as wide as the rows of x: a narrower C is a smaller
  // store each group.
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette = 1;
  for (int t : {0, 1, 2, 3, 4, 5}) {
    config.rows[t] = 16;
    config.colsb[t] = static_cast<uint16_t>(t == 2 || t == 3 ? 64 : 4 * rows);
  }
  _tile_loadconfig(&config);
  const int groups = k / group_size;
  const std::size_t row_bytes = static_cast<std::size_t>(k) / 2;
  const Unpacker unpack;
  thread_local std::vector<float> scale32, bias32;
  scale32.resize(static_cast<std::size_t>(16) * groups);
  bias32.resize(static_cast<std::size_t>(16) * groups);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
  for (int n = n0; n < n1; n += 16) {
    amx_widen_rows(scales, scale_type, static_cast<std::size_t>(n) * groups, scale32.size(), scale32.data());
    amx_widen_rows(biases, scale_type, static_cast<std::size_t>(n) * groups, bias32.size(), bias32.data());
    const uint8_t* block = bytes + static_cast<std::size_t>(n) * row_bytes;
    const auto args = std::make_tuple(unpack, prepared, xsum_t, rows, k, block, scale32.data(),
                                      bias32.data(), n, out, ldo);
    if (group_size == 32) std::apply(small_block<1>, args);
    else if (group_size == 64) std::apply(small_block<2>, args);
    else std::apply(small_block<4>, args);
  }
  _tile_release();
}

#else

void amx_prepare_small_x(const uint16_t*, int, int, uint16_t*) {}
std::size_t amx_small_x_size(int, int) { return 0; }
void amx_quantized_gemv(const uint16_t*, const float*, int, int, const uint32_t*, const void*,
                        const void*, int, int, int, int, float*, int) {}

bool amx_available() { return false; }
void amx_half_gemm(const uint16_t*, int, int, const uint16_t*, int, int, float*, int) {}
void amx_quantized_gemm(const uint16_t*, int, int, const uint32_t*, const void*, int, int, int,
                        int, float*, int) {}

#endif

}  // namespace exo_kernels
