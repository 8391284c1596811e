// bf16 by bf16 products on Intel AMX tiles (Sapphire Rapids and later): for prefill, where many
// rows of x meet each weight row. A tile multiply takes 16x32 by 32x16 at once, exact products
// and fp32 sums, as AVX512-BF16's dot products do.
#pragma once

#include <cstddef>
#include <cstdint>

namespace exo_kernels {

// Whether this CPU has AMX-BF16 and the OS lets this process use its tiles (asked once).
bool amx_available();
// Turned off by set_amx(false) (tests compare both paths).
extern bool amx_enabled;

// The bf16 rows of x, rearranged for the tiles (see amx.cpp), padded to a multiple of 32 rows:
// amx_x_size(rows, k) values. `nibble_order` takes each chunk of 64 values as its even
// positions, then its odd ones (the order of 4-bit weights' low and high nibbles).
std::size_t amx_x_size(int rows, int k);
void amx_prepare_x(const uint16_t* x, int rows, int k, uint16_t* prepared, bool nibble_order);

// out[m, n] = x[m] . w[n] for n in [n0, n1), both multiples of 32; k a multiple of 32.
void amx_half_gemm(const uint16_t* prepared, int rows, int k, const uint16_t* w, int n0, int n1,
                   float* out, int ldo);

// The same for MLX's 4-bit weights (groups of 64 or 128) by bf16 x: each group's sum of q * x
// (q exact in bf16) on the tiles, its scale applied per group in fp32. `prepared` comes from x
// with nibble_order. Leaves
// out the biases' term (sum over groups of bias * sum of x), which the caller adds.
void amx_quantized_gemm(const uint16_t* prepared, int rows, int k, const uint32_t* w,
                        const void* scales, int scale_type, int group_size, int n0, int n1,
                        float* out, int ldo);

}  // namespace exo_kernels
