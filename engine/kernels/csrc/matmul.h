// The two products, on plain buffers: they pick the instruction set, split the work among the
// threads and choose between the GEMV path (few rows) and dequantized tiles through BLAS.
#pragma once

#include <cstdint>

#include "kernels.h"

namespace exo_kernels {

// out[M, N] = x[M, K] @ dequantize(w, scales, biases)[N, K]^T: MLX's affine format, or MXFP4
// (`mxfp4`: E8M0 scales, no biases; scale_type is then unused).
void run_quantized_matmul(const void* x, Scalar x_type, int rows, int k, const uint32_t* w,
                          const void* scales, const void* biases, Scalar scale_type, int n,
                          int group_size, int bits, bool mxfp4, void* out, Scalar out_type);

// out[t, M, N] = x[xi[t], M, K] @ dequantize(w[e[t]], ...)^T for t in [0, pairs): the experts'
// products of a mixture of experts (mx.gather_qmm), each expert's weights read once for every
// row routed to it. x is [X, M, K], w [experts, N, K * bits / 32], scales and biases
// [experts, N, K / group_size]; xi and e are checked against X and experts first (a pair out of
// range gets NaN, and the return value counts such pairs).
long run_gather_quantized_matmul(const void* x, Scalar x_type, int m, int k, const uint32_t* xi,
                                 const uint32_t* e, int pairs, int x_count, int experts,
                                 const uint32_t* w, const void* scales, const void* biases,
                                 Scalar scale_type, int n, int group_size, int bits, bool mxfp4,
                                 void* out, Scalar out_type);

// out[M, N] = x[M, K] @ w[N, K]^T with w in bf16, fp16 or fp32.
void run_dense_matmul(const void* x, Scalar x_type, int rows, int k, const void* w, Scalar w_type,
                      int n, void* out, Scalar out_type);

// Up to this many rows of x a product runs as GEMVs; past it, as BLAS on dequantized tiles.
extern int gemv_max_rows;
// From this many rows of x, bf16 by bf16 runs on AMX tiles where the CPU has them.
extern int amx_min_rows;
// From this many rows of x (up to AMX_SMALL_MAX_ROWS), 4-bit products run on AMX's bf16 tiles
// too; fewer rows run faster as 8-bit GEMVs (bench/kernel_rows.py).
extern int amx_small_min_rows;
// The same on the 8-bit tiles, where the CPU has them (group sizes 64 and 128).
extern int amx_int8_min_rows;
// From this many rows of x, bf16 by 4-bit dot products in hardware take x as 8-bit integers
// (twice the products an instruction) rather than 16-bit ones.
extern int int8_min_rows;
// Up to this many rows of x an expert's product shares one pass with the other experts'
// (run_gather_quantized_matmul); more rows run as a product of their own.
extern int gather_joint_max_rows;

}  // namespace exo_kernels
