// What the products share inside the kernels (matmul.cpp, gather_matmul.cpp): per-thread
// buffers, x prepared for the GEMVs, the split of rows among threads, the redo of outputs that
// are not finite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kernels.h"

namespace exo_kernels::detail {

// Buffers kept per thread between calls, so a decoding step allocates nothing.
struct Scratch {
  std::vector<float> x, prepared, sums, sums32, out, tile, bias;
  std::vector<uint16_t> tiles_x;
  std::vector<int16_t> int_x;
  std::vector<int8_t> int8_x, byte_x;
  std::vector<float> xsum_t, int_x_scales, tile_steps, tile_sums;
};
Scratch& scratch();
float* sized(std::vector<float>& buffer, std::size_t count);

// Rows [0, n) split into `parts` ranges, each a multiple of `align` rows but the last.
std::pair<int, int> share(int n, int parts, int part, int align);

// x as the GEMV reads it: in fp32 and in the weights' nibble order, or as 16-bit integers for
// the dot products in hardware; and each group's sum of x.
struct GemvX {
  const float* x;         // fp32, as it came
  const float* prepared;  // fp32, each 4-bit chunk's even values then its odd ones
  const int16_t* xq;      // 16-bit integers in nibble order (nullptr: another path)
  const int8_t* xq8;      // or 8-bit ones, for several rows
  const float* xq_scales;
  const float* sums;      // [rows, groups]
  const int8_t* xb = nullptr;  // or 8-bit ones for 8-bit and MXFP4 weights (prepare_byte_x)
};

// x prepared for the GEMVs into `s` (see matmul.cpp).
GemvX prepare_x(const Isa& isa, Scratch& s, const void* x_in, Scalar x_type, int rows, int k,
                int group_size, int bits, bool nibble_dot, bool layout, bool tiles,
                bool byte_dot = false, bool mxfp4 = false);

// bf16 x by 8-bit affine weights with bf16 scales, or by MXFP4: 8-bit integer dot products in
// hardware (byte_dot_impl.h).
bool takes_byte_dot(const Isa& isa, Scalar x_type, int bits, bool mxfp4, Scalar scale_type, int k);

// bf16 x by 4-bit affine weights with bf16 scales: integer dot products in hardware.
bool takes_nibble_dot(const Isa& isa, Scalar x_type, int bits, Scalar scale_type, int k,
                      int group_size);

// Outputs that are not finite, computed again the way MLX does (see matmul.cpp).
void redo_non_finite(const Isa& isa, const float* x, const void* x_in, Scalar x_type, int rows,
                     int k, const uint32_t* w, const void* scales, const void* biases,
                     Scalar scale_type, int n, int group_size, int bits, bool mxfp4, float* out);

}  // namespace exo_kernels::detail
