#include "matmul.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amx.h"
#include "half_bits.h"
#include "matmul_parts.h"
#include "threads.h"

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);

namespace exo_kernels {

int gemv_max_rows = 96;
int amx_min_rows = 16;
int amx_small_min_rows = 14;
int int8_min_rows = 2;
int amx_int8_min_rows = 7;

namespace detail {

constexpr int CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112;
// A tile of dequantized weights holds about this many floats (4 MiB): big enough for BLAS to run
// at full speed, small enough to stay in the caches between the dequantizing and the product.
constexpr std::size_t TILE_FLOATS = std::size_t{1} << 20;

Scratch& scratch() {
  thread_local Scratch buffers;
  return buffers;
}

float* sized(std::vector<float>& buffer, std::size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

const float* as_f32(const Isa& isa, const void* in, Scalar type, std::size_t count,
                    std::vector<float>& buffer) {
  if (type == Scalar::f32) return static_cast<const float*>(in);
  float* out = sized(buffer, count);
  isa.to_f32(in, type, count, out);
  return out;
}

// Rows [0, n) split into `parts` ranges, each a multiple of `align` rows but the last.
std::pair<int, int> share(int n, int parts, int part, int align) {
  const int blocks = (n + align - 1) / align;
  const int b0 = static_cast<int>(static_cast<long>(blocks) * part / parts);
  const int b1 = static_cast<int>(static_cast<long>(blocks) * (part + 1) / parts);
  return {std::min(n, b0 * align), std::min(n, b1 * align)};
}

constexpr int PARTS_PER_THREAD = 4;

void gemv_parallel(int n, std::size_t weight_bytes, const std::function<void(int, int)>& rows) {
  // Several parts a thread, taken as each thread comes free: a thread the OS takes off its
  // core (the API's threads, a client on the same cores) holds up only the part it is in.
  const int parts = work_parts(weight_bytes, std::min(thread_count() * PARTS_PER_THREAD, (n + 3) / 4));
  parallel_for(parts, [&](int part) {
    const auto [n0, n1] = share(n, parts, part, 4);
    if (n0 < n1) rows(n0, n1);
  });
}

// BLAS on tiles of `tile_rows` weight rows, each widened to fp32 by the threads first.
void tiled_gemm(const float* x, int rows, int k, int n, float* out,
                const std::function<void(int, int, float*)>& widen) {
  const int tile_rows = static_cast<int>(std::clamp<std::size_t>(TILE_FLOATS / k, 16, 4096));
  float* tile = sized(scratch().tile, static_cast<std::size_t>(tile_rows) * k);
  for (int t0 = 0; t0 < n; t0 += tile_rows) {
    const int t1 = std::min(n, t0 + tile_rows);
    const int parts = std::max(1, std::min(thread_count(), (t1 - t0) / 8));
    parallel_for(parts, [&](int part) {
      const auto [a, b] = share(t1 - t0, parts, part, 8);
      if (a < b) widen(t0 + a, t0 + b, tile + static_cast<std::size_t>(a) * k);
    });
    cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, rows, t1 - t0, k, 1.0f, x, k, tile,
                k, 0.0f, out + t0, n);
  }
}

float scalar_at(const void* values, Scalar type, std::size_t i) {
  switch (type) {
    case Scalar::f32: return static_cast<const float*>(values)[i];
    case Scalar::bf16: return bf16_to_float(static_cast<const uint16_t*>(values)[i]);
    case Scalar::f16: return f16_to_float(static_cast<const uint16_t*>(values)[i]);
  }
  return 0.0f;
}

// `v` rounded to `type`, as MLX's arithmetic in that type rounds each result.
float rounded(Scalar type, float v) {
  switch (type) {
    case Scalar::f32: return v;
    case Scalar::bf16: return bf16_to_float(float_to_bf16(v));
    case Scalar::f16: return f16_to_float(float_to_f16(v));
  }
  return v;
}

// The kernels factor each group's sum as scale * sum(q * x) + bias * sum(x). Where a scale, a
// bias or x is not finite, MLX's own product, which dequantizes each weight first, can give NaN
// where the factored one gives an infinity: any output that is not finite is computed again the
// way MLX does. Finite weights and x never take this path. `x` is fp32 where the product
// widened it (else nullptr: it is widened here, if needed).
void redo_non_finite(const Isa& isa, const float* x, const void* x_in, Scalar x_type, int rows,
                     int k, const uint32_t* w, const void* scales, const void* biases,
                     Scalar scale_type, int n, int group_size, int bits, bool mxfp4, float* out) {
  const std::size_t count = static_cast<std::size_t>(rows) * n;
  if (std::all_of(out, out + count, [](float v) { return std::isfinite(v); })) return;
  std::vector<float> widened;
  if (x == nullptr) x = as_f32(isa, x_in, x_type, static_cast<std::size_t>(rows) * k, widened);
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w);
  const std::size_t row_bytes = static_cast<std::size_t>(k) * bits / 8;
  const int groups = k / group_size;
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < n; ++j) {
      float& value = out[static_cast<std::size_t>(m) * n + j];
      if (std::isfinite(value)) continue;
      float total = 0.0f;
      if (mxfp4) {  // as MLX: each group's sum of code value times x, then times its scale
        for (int g = 0; g < groups; ++g) {
          float sum = 0.0f;
          for (int i = g * group_size; i < (g + 1) * group_size; ++i) {
            const uint8_t byte = bytes[static_cast<std::size_t>(j) * row_bytes + i / 2];
            sum += e2m1_to_float(i % 2 == 0 ? byte & 15 : byte >> 4) *
                   x[static_cast<std::size_t>(m) * k + i];
          }
          const uint8_t e = static_cast<const uint8_t*>(scales)[static_cast<std::size_t>(j) * groups + g];
          total += sum * e8m0_to_float(e);
        }
        value = total;
        continue;
      }
      // MLX dequantizes each weight in x's type, rounding the product and the sum: a weight
      // that rounds to 0 there makes an infinite x NaN.
      for (int i = 0; i < k; ++i) {
        const uint8_t byte = bytes[static_cast<std::size_t>(j) * row_bytes + i * bits / 8];
        const int q = bits == 4 ? (i % 2 == 0 ? byte & 15 : byte >> 4) : byte;
        const std::size_t g = static_cast<std::size_t>(j) * groups + i / group_size;
        const float scaled = rounded(x_type, scalar_at(scales, scale_type, g) * static_cast<float>(q));
        const float weight = rounded(x_type, scaled + scalar_at(biases, scale_type, g));
        total += weight * x[static_cast<std::size_t>(m) * k + i];
      }
      value = total;
    }
}


// `bytes` of `buffer` on a 64-byte line: each 64-byte load then reads one line, not parts of two.
int8_t* aligned_bytes(std::vector<int8_t>& buffer, std::size_t bytes) {
  buffer.resize(std::max(buffer.size(), bytes + 64));
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (64 - address % 64) % 64;
}

// `layout`: whether any row of the weights runs as a GEMV (the tiles take x as it came);
// `tiles`: whether some run on AMX tiles (which take the exact sums of x for the biases' term).
// Returns x in fp32 as `x`, except on the 8-bit path (nullptr: it reads only the integers).
GemvX prepare_x(const Isa& isa, Scratch& s, const void* x_in, Scalar x_type, int rows, int k,
                int group_size, int bits, bool nibble_dot, bool layout, bool tiles,
                bool byte_dot, bool mxfp4) {
  const std::size_t x_count = static_cast<std::size_t>(rows) * k;
  GemvX out{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  const int groups = k / group_size;
  float* sums = sized(s.sums, static_cast<std::size_t>(rows) * groups);
  out.sums = sums;
  // x as 8-bit integers: the biases' term takes the sums of x as rounded, each group's from its
  // 32s' (see prepare_int8_x and prepare_byte_x).
  const auto group_sums = [&](const float* sums32) {
    const int per_group = group_size / 32;
    for (std::size_t g = 0; g < static_cast<std::size_t>(rows) * groups; ++g) {
      float total = 0.0f;
      for (int i = 0; i < per_group; ++i) total += sums32[g * per_group + i];
      sums[g] = total;
    }
  };
  if (byte_dot && layout && !tiles) {
    int8_t* xb = aligned_bytes(s.byte_x, byte_x_bytes(rows, k));
    float* sums32 = sized(s.sums32, x_count / 32);
    isa.prepare_byte_x(static_cast<const uint16_t*>(x_in), rows, k, mxfp4, xb, sums32);
    out.xb = xb;
    group_sums(sums32);
    return out;
  }
  // 8-bit integers take x in steps of 512 values (the last of 256; see int8_x_offset).
  if (nibble_dot && layout && !tiles && rows >= int8_min_rows && k % 256 == 0) {
    int8_t* xq = aligned_bytes(s.int8_x, int8_x_bytes(rows, k));
    float* sums32 = sized(s.sums32, x_count / 32);
    isa.prepare_int8_x(static_cast<const uint16_t*>(x_in), rows, k, xq, sums32);
    out.xq8 = xq;
    group_sums(sums32);
    return out;
  }
  out.x = as_f32(isa, x_in, x_type, x_count, s.x);
  out.prepared = out.x;
  // 4 bits: each chunk of 2 * lanes values is split into its even and odd positions, the order
  // in which a chunk's bytes give their low and high nibbles. The weights are read in that same
  // order, so the dot products are unchanged.
  if (nibble_dot && layout) {
    s.int_x.resize(std::max(s.int_x.size(), x_count));
    float* scales = sized(s.int_x_scales, x_count / 8);
    isa.prepare_int_x(static_cast<const uint16_t*>(x_in), rows, k, s.int_x.data(), scales);
    out.xq = s.int_x.data();
    out.xq_scales = scales;
  } else if (bits == 4 && layout) {
    float* p = sized(s.prepared, x_count);
    const int chunk = 2 * isa.lanes, half = isa.lanes;
    for (std::size_t base = 0; base < x_count; base += chunk)
      for (int i = 0; i < half; ++i) {
        p[base + i] = out.x[base + 2 * i];
        p[base + half + i] = out.x[base + 2 * i + 1];
      }
    out.prepared = p;
  }
  for (int m = 0; m < rows; ++m)
    for (int g = 0; g < groups; ++g) {
      // 16 partial sums: one chain of additions would wait on each add in turn.
      float lanes[16] = {};
      const float* v = out.x + static_cast<std::size_t>(m) * k + static_cast<std::size_t>(g) * group_size;
      for (int i = 0; i < group_size; i += 16)
        for (int l = 0; l < 16; ++l) lanes[l] += v[i + l];
      float total = 0.0f;
      for (float lane : lanes) total += lane;
      sums[m * groups + g] = total;
    }
  return out;
}

// bf16 x by 4-bit weights with bf16 scales: integer dot products in hardware.
bool takes_byte_dot(const Isa& isa, Scalar x_type, int bits, bool mxfp4, Scalar scale_type, int k) {
  return isa.prepare_byte_x != nullptr && x_type == Scalar::bf16 && k % 64 == 0 &&
         (mxfp4 || (bits == 8 && scale_type == Scalar::bf16));
}

bool takes_nibble_dot(const Isa& isa, Scalar x_type, int bits, Scalar scale_type, int k,
                      int group_size) {
  return isa.prepare_int_x != nullptr && x_type == Scalar::bf16 && bits == 4 &&
         scale_type == Scalar::bf16 && k % 128 == 0 && group_size <= 128;
}

}  // namespace detail

using namespace detail;

void run_quantized_matmul(const void* x_in, Scalar x_type, int rows, int k, const uint32_t* w,
                          const void* scales, const void* biases, Scalar scale_type, int n,
                          int group_size, int bits, bool mxfp4, void* out, Scalar out_type) {
  const Isa& isa = best_isa();
  Scratch& s = scratch();
  const int groups = k / group_size;
  // Many rows of bf16 x by 4-bit weights on AMX tiles, 32 weight rows at a time (fewer rows of
  // x than amx_min_rows run faster as GEMVs).
  const bool amx = isa.bf16_dot && x_type == Scalar::bf16 && bits == 4 && !mxfp4 &&
                   amx_enabled && n >= 32 && amx_available();
  // A few rows (several requests decoding at once): one tile of x against every weight row,
  // on the 8-bit tiles where the CPU has them (x as 8-bit integers, as the 8-bit GEMV takes it
  // from int8_min_rows), else on the bf16 ones.
  const bool few = amx && rows <= AMX_SMALL_MAX_ROWS;
  const bool int8_tiles = few && rows >= amx_int8_min_rows && rows >= int8_min_rows &&
                          group_size % 64 == 0 && k % 256 == 0 && amx_int8_available();
  const bool small_tiles = few && !int8_tiles && rows >= amx_small_min_rows &&
                           group_size >= 32 && group_size % 32 == 0;
  const bool tiles =
      amx && !small_tiles && !int8_tiles && group_size % 64 == 0 && rows >= amx_min_rows;
  const int tiled = tiles || small_tiles || int8_tiles ? n - n % 32 : 0;
  // Only the rows the tiles leave need x in the GEMV's order. The dot products in hardware
  // take any number of rows: at 512 rows they ran faster than OpenBLAS on dequantized tiles.
  const bool nibble_dot = !mxfp4 && takes_nibble_dot(isa, x_type, bits, scale_type, k, group_size);
  // The 8-bit tiles round x themselves: x in fp32 and its sums serve only weight rows past them.
  const bool byte_dot = takes_byte_dot(isa, x_type, bits, mxfp4, scale_type, k);
  const GemvX px =
      int8_tiles && tiled == n
          ? GemvX{}
          : prepare_x(isa, s, x_in, x_type, rows, k, group_size, bits, nibble_dot, tiled < n,
                      tiled > 0, byte_dot, mxfp4);
  const std::size_t out_count = static_cast<std::size_t>(rows) * n;
  float* out32 = out_type == Scalar::f32 ? static_cast<float*>(out) : sized(s.out, out_count);
  QuantizedArgs args{px.prepared, px.sums, rows, k, n, w, scales, biases, scale_type, group_size,
                     bits, out32, n, px.xq, px.xq_scales, px.xq8, mxfp4, px.xb};
  if (int8_tiles) {
    s.int8_x.resize(std::max(s.int8_x.size(), amx_int8_x_bytes(k, rows)));
    const std::size_t per_block = static_cast<std::size_t>(k / 64) * 16;
    float* steps = sized(s.tile_steps, per_block);
    float* sums = sized(s.tile_sums, per_block);
    amx_int8_prepare_x(static_cast<const uint16_t*>(x_in), rows, k, s.int8_x.data(), steps, sums);
    const int blocks = tiled / 32;
    const int parts = std::max(1, std::min(thread_count(), blocks));
    parallel_for(parts, [&](int part) {
      const auto [b0, b1] = share(blocks, parts, part, 1);
      if (b0 < b1)
        amx_int8_gemv(s.int8_x.data(), steps, sums, rows, k, w, scales, biases,
                      static_cast<int>(scale_type), group_size, b0 * 32, b1 * 32, out32, n);
    });
    if (tiled < n) isa.quantized_gemv(args, tiled, n);
  } else if (small_tiles) {
    s.tiles_x.resize(std::max(s.tiles_x.size(), amx_small_x_size(k, rows)));
    amx_prepare_small_x(static_cast<const uint16_t*>(x_in), rows, k, s.tiles_x.data());
    float* xsum_t = sized(s.xsum_t, static_cast<std::size_t>(groups) * AMX_SMALL_MAX_ROWS);
    std::fill(xsum_t, xsum_t + static_cast<std::size_t>(groups) * AMX_SMALL_MAX_ROWS, 0.0f);
    for (int m = 0; m < rows; ++m)
      for (int g = 0; g < groups; ++g) xsum_t[g * AMX_SMALL_MAX_ROWS + m] = px.sums[m * groups + g];
    const int blocks = tiled / 32;
    const int parts = std::max(1, std::min(thread_count(), blocks));
    parallel_for(parts, [&](int part) {
      const auto [b0, b1] = share(blocks, parts, part, 1);
      if (b0 < b1)
        amx_quantized_gemv(s.tiles_x.data(), xsum_t, rows, k, w, scales, biases,
                           static_cast<int>(scale_type), group_size, b0 * 32, b1 * 32, out32, n);
    });
    if (tiled < n) isa.quantized_gemv(args, tiled, n);
  } else if (tiles) {
    // x in bf16 as it came, in the nibbles' order; the rest of the rows, and the biases' term,
    // elsewhere.
    const int pairs = tiled / 32;
    s.tiles_x.resize(std::max(s.tiles_x.size(), amx_x_size(rows, k)));
    uint16_t* prepared16 = s.tiles_x.data();
    amx_prepare_x(static_cast<const uint16_t*>(x_in), rows, k, prepared16, true);
    const int parts = std::max(1, std::min(thread_count(), pairs));
    parallel_for(parts, [&](int part) {
      const auto [p0, p1] = share(pairs, parts, part, 1);
      if (p0 < p1)
        amx_quantized_gemm(prepared16, rows, k, w, scales, static_cast<int>(scale_type),
                           group_size, p0 * 32, p1 * 32, out32, n);
    });
    // out[m, n] += sum over groups of xsum[m, g] * bias[n, g]: a small product through BLAS.
    float* bias32 = sized(s.bias, static_cast<std::size_t>(tiled) * groups);
    isa.to_f32(biases, scale_type, static_cast<std::size_t>(tiled) * groups, bias32);
    cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, rows, tiled, groups, 1.0f, px.sums,
                groups, bias32, groups, 1.0f, out32, n);
    if (tiled < n) isa.quantized_gemv(args, tiled, n);
  } else if (rows <= gemv_max_rows || nibble_dot || byte_dot) {
    const std::size_t bytes = static_cast<std::size_t>(n) * (k * bits / 8 + groups * 4);
    gemv_parallel(n, bytes, [&](int n0, int n1) { isa.quantized_gemv(args, n0, n1); });
  } else {
    tiled_gemm(px.prepared, rows, k, n, out32, [&](int n0, int n1, float* tile) {
      isa.quantized_dequantize(args, n0, n1, tile);
    });
  }
  redo_non_finite(isa, px.x, x_in, x_type, rows, k, w, scales, biases, scale_type, n, group_size,
                  bits, mxfp4, out32);
  if (out_type != Scalar::f32) isa.from_f32(out32, out_type, out_count, out);
}

void run_dense_matmul(const void* x_in, Scalar x_type, int rows, int k, const void* w_in,
                      Scalar w_type, int n, void* out, Scalar out_type) {
  const Isa& isa = best_isa();
  Scratch& s = scratch();
  const bool f32 = w_type == Scalar::f32;
  const uint16_t* w = f32 ? nullptr : static_cast<const uint16_t*>(w_in);
  const float* w32 = f32 ? static_cast<const float*>(w_in) : nullptr;
  // bf16 by bf16 in hardware reads x as it is; every other path takes it in fp32.
  const bool dot = isa.bf16_dot && x_type == Scalar::bf16 && w_type == Scalar::bf16;
  // The dot products in hardware take any number of rows (faster than BLAS on widened tiles).
  const bool gemv = rows <= gemv_max_rows || dot;
  if (dot && amx_enabled && rows >= amx_min_rows && k % 32 == 0 && n >= 32 && amx_available()) {
    const std::size_t out_count = static_cast<std::size_t>(rows) * n;
    float* out32 = out_type == Scalar::f32 ? static_cast<float*>(out) : sized(s.out, out_count);
    const uint16_t* x16 = static_cast<const uint16_t*>(x_in);
    s.tiles_x.resize(std::max(s.tiles_x.size(), amx_x_size(rows, k)));
    amx_prepare_x(x16, rows, k, s.tiles_x.data(), false);
    const int tiled = n - n % 32, pairs = tiled / 32;
    const int parts = std::max(1, std::min(thread_count(), pairs));
    parallel_for(parts, [&](int part) {
      const auto [p0, p1] = share(pairs, parts, part, 1);
      if (p0 < p1) amx_half_gemm(s.tiles_x.data(), rows, k, w, p0 * 32, p1 * 32, out32, n);
    });
    if (tiled < n) {  // the last rows (fewer than 32) as dot products
      HalfArgs args{nullptr, x16, rows, k, n, w, w_type, out32, n};
      isa.half_gemv(args, tiled, n);
    }
    if (out_type != Scalar::f32) isa.from_f32(out32, out_type, out_count, out);
    return;
  }
  const float* x =
      dot && gemv ? nullptr : as_f32(isa, x_in, x_type, static_cast<std::size_t>(rows) * k, s.x);
  const std::size_t out_count = static_cast<std::size_t>(rows) * n;
  float* out32 = out_type == Scalar::f32 ? static_cast<float*>(out) : sized(s.out, out_count);
  HalfArgs args{x, dot ? static_cast<const uint16_t*>(x_in) : nullptr, rows, k, n, w, w_type,
                out32, n, w32};
  // fp32 weights (the demo's) take the GEMV too: OpenBLAS packed the weights for every product
  // of a few rows and handed tiny ones to its threads; here each weight is read once, in place.
  if (gemv) {
    gemv_parallel(n, static_cast<std::size_t>(n) * k * (f32 ? 4 : 2),
                  [&](int n0, int n1) { isa.half_gemv(args, n0, n1); });
  } else if (f32) {  // already fp32: no tile to widen
    cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, rows, n, k, 1.0f, x, k, w32, k,
                0.0f, out32, n);
  } else {
    tiled_gemm(x, rows, k, n, out32,
               [&](int n0, int n1, float* tile) { isa.half_widen(args, n0, n1, tile); });
  }
  if (out_type != Scalar::f32) isa.from_f32(out32, out_type, out_count, out);
}

}  // namespace exo_kernels
