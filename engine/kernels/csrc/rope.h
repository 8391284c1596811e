// Rotary position embeddings: MLX's CPU runs mx.fast.rope as its fallback graph of about twenty
// generic ops, which on a decoding step costs many times the arithmetic.
#pragma once

#include <cstdint>

#include "kernels.h"

namespace exo_kernels {

// x viewed as [B, N, T, D] with element strides `strides`; out contiguous
// [B, N, T, D]. Position t of batch b is (t + offsets[b or 0]) * scale; feature pair i of the
// first `dims` turns by position * inv_freqs[i]. Rounded as MLX's fallback rounds: cos and sin
// to `type`, then each product and each sum.
struct RopeArgs {
  const void* x;
  void* out;
  Scalar type;
  long batch, heads, positions, features;
  long strides[4];  // of B, N, T and D
  const int32_t* offsets;
  long offset_stride;
  bool offset_per_batch;
  const float* inv_freqs;  // dims / 2 of them
  long inv_stride;
  int dims;
  bool traditional;
  float scale;
};

void run_rope(const RopeArgs& args);

}  // namespace exo_kernels
