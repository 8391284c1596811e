// RMS normalisation of rows: MLX's CPU runs mx.fast.rms_norm as a chain of generic ops, which
// on a decoding step's single row costs many times the arithmetic.
#pragma once

#include <cstdint>

#include "kernels.h"

namespace exo_kernels {

// out[r] = round(round(x[r] * rsqrt(mean(x[r]^2) + eps)) * w), in fp32 with the two roundings
// to `type` that MLX's own rms_norm makes; x, w and out all of `type`, rows of `d` values.
void run_rms_norm(const void* x, const void* w, void* out, Scalar type, long rows, int d,
                  float eps);

}  // namespace exo_kernels
