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

// Few rows of x (up to 16: decoding several requests at once) by 4-bit weights, on the tiles.
// One tile of x serves every weight row, and the weights are unpacked per group straight into
// a small buffer, so a call reads the weights once, as the GEMV does, at any row count up to 16.
constexpr int AMX_SMALL_MAX_ROWS = 16;
// x for amx_quantized_gemv: per 32 values of k one tile of 16 rows of `rows` pairs, row kk
// holding each x row's pair at positions 2kk, 2kk+1 of the chunk's broadcast order (position i
// is value 4 (i % 8) + i / 8: the order in which the tiles' unpacking gives a chunk's nibbles).
// amx_small_x_size(k, rows) values.
std::size_t amx_small_x_size(int k, int rows);
void amx_prepare_small_x(const uint16_t* x, int rows, int k, uint16_t* prepared);
// out[m, n] = sum over groups of scale * (q . x) + bias * xsum, for n in [n0, n1), multiples of 32.
// `xsum_t` holds the sums of x over each group as [group][16] (rows past `rows` zero).
void amx_quantized_gemv(const uint16_t* prepared, const float* xsum_t, int rows, int k,
                        const uint32_t* w, const void* scales, const void* biases, int scale_type,
                        int group_size, int n0, int n1, float* out, int ldo);

// The tiles' configuration (palette 1), as _tile_loadconfig reads it.
struct TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed));

// Weight rows' scales or biases (fp32, bf16 or fp16: type 0, 1, 2) from index `first` as fp32.
void amx_widen_rows(const void* values, int type, std::size_t first, std::size_t count,
                    float* out);

// The same few rows of x on the 8-bit tiles (amx_int8.cpp), where the CPU has AMX-INT8: x
// rounded to 8-bit integers per 64 values (as the 8-bit GEMV rounds it), group sizes 64 and 128,
// k a multiple of 256.
bool amx_int8_available();
// x for amx_int8_gemv: per 64 values of k, `rows` rows of 64 bytes (an A tile), each 8 values in
// the order 0, 2, 4, 6, 1, 3, 5, 7 (amx_int8_x_bytes(k, rows) bytes); `steps` and `sums` ([k /
// 64][16], rows past `rows` zero) each block's step for each row of x (NaN where a value is not
// finite) and its integers' sum times that step.
std::size_t amx_int8_x_bytes(int k, int rows);
void amx_int8_prepare_x(const uint16_t* x, int rows, int k, int8_t* prepared, float* steps,
                        float* sums);
// out[m, n] = sum over groups of scale * (q . x) + bias * (sum of x), for n in [n0, n1),
// multiples of 16.
void amx_int8_gemv(const int8_t* prepared, const float* steps, const float* sums, int rows,
                   int k, const uint32_t* w, const void* scales, const void* biases,
                   int scale_type, int group_size, int n0, int n1, float* out, int ldo);

}  // namespace exo_kernels
