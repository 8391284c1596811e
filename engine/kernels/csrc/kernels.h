// The kernels' interface: one table of functions per instruction set, chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace exo_kernels {

enum class Scalar : int { f32 = 0, bf16 = 1, f16 = 2 };

// out[m, n] = sum_k x[m, k] * (scale[n, g] * q[n, k] + bias[n, g]), g = k / group_size.
// `x` is fp32, prepared by `prepare_x` (for 4 bits the halves of each chunk of 2 * lanes values
// are split into even and odd positions, matching the nibbles of a byte); `xsum` holds the sum of
// x over each group, for the bias term.
struct QuantizedArgs {
  const float* x;
  const float* xsum;
  int rows;  // M
  int k;
  int n;
  const uint32_t* w;  // [n, k * bits / 32]
  const void* scales;  // [n, k / group_size]
  const void* biases;
  Scalar scale_type;
  int group_size;
  int bits;
  float* out;  // [M, ldo] fp32
  int ldo;
  // Where x is bf16, the scales bf16 and the bits 4, on a table with prepare_int_x: x as 16-bit
  // integers in the order of its weights' nibbles and their scales (see prepare_int_x), for
  // integer dot products in hardware. Otherwise nullptr.
  const int16_t* xq = nullptr;
  const float* xq_scales = nullptr;
  // Or, for several rows of x, x as 8-bit integers with their steps (see prepare_int8_x), laid
  // out as int8_x_offset says.
  const int8_t* xq8 = nullptr;
  // MXFP4 (MLX's mode "mxfp4", ggml's MXFP4 block): 4-bit E2M1 codes in the affine format's
  // nibble order, groups of 32, `scales` one E8M0 byte a group (2^(e - 127)), no biases.
  bool mxfp4 = false;
  // Or, for 8-bit affine and MXFP4 weights, x as prepare_byte_x lays it out.
  const int8_t* xb = nullptr;
};

// prepare_byte_x's x: blocks of 128 values, 256 bytes each (see byte_dot_impl.h).
inline std::size_t byte_x_bytes(int rows, int k) {
  return static_cast<std::size_t>(rows) * ((k + 127) / 128) * 256;
}

// 8-bit x, 512 values a step (the last 256 where a row's length is not a multiple of 512): each
// step's integers, then its 16 floats (the step of each lane), in 576 bytes. The GEMV takes the
// steps INT8_STEPS_PER_PASS at a time (x of several rows then stays in the L1 cache while the
// weight rows pass over it), so each pass of steps is stored whole, row after row: the rows'
// bytes fill the cache's sets evenly. (With each row's steps together, rows 8 KiB apart fell in
// the same sets, and the GEMV ran at half its speed.)
constexpr int INT8_STEP_VALUES = 512;
constexpr int INT8_STEP_BYTES = 576;
constexpr int INT8_STEPS_PER_PASS = 4;
inline std::size_t int8_x_offset(int rows, int k, int m, int step) {
  const int steps = (k + INT8_STEP_VALUES - 1) / INT8_STEP_VALUES;
  const int first = step - step % INT8_STEPS_PER_PASS;
  const int in_pass = steps - first < INT8_STEPS_PER_PASS ? steps - first : INT8_STEPS_PER_PASS;
  return (static_cast<std::size_t>(first) * rows + static_cast<std::size_t>(m) * in_pass +
          static_cast<std::size_t>(step - first)) * INT8_STEP_BYTES;
}
inline std::size_t int8_x_bytes(int rows, int k) {
  return static_cast<std::size_t>(rows) * ((k + INT8_STEP_VALUES - 1) / INT8_STEP_VALUES) *
         INT8_STEP_BYTES;
}

// out[m, n] = sum_k x[m, k] * w[n, k], with w in bf16, fp16 or fp32 (w32).
struct HalfArgs {
  const float* x;  // [M, k] fp32
  const uint16_t* x16;  // the same rows in bf16, where x is bf16 (else nullptr)
  int rows;
  int k;
  int n;
  const uint16_t* w;  // [n, k] where w_type is bf16 or fp16
  Scalar w_type;
  float* out;  // [M, ldo] fp32
  int ldo;
  const float* w32 = nullptr;  // [n, k] where w_type is f32
};

// softmax(scale * q . k + mask) . v for each query row against every key, in fp32: decoding's
// attention (a few query rows a head). q and out are contiguous [B, H, Lq, D]; k and v are
// [B, KV heads, L, D] with D contiguous and the other three strides (in elements) given; the
// mask, if any, broadcasts to [B, H, Lq, L] with L contiguous, its strides over [B, H, Lq] given
// (0 on a broadcast axis). q, k, v and out share `type`.
struct AttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  Scalar type;
  const void* mask;
  int mask_kind;  // 0: none; 1: bool (nonzero attends); 2: additive fp32
  int batch, heads, kv_heads, queries, keys, dim;
  float scale;
  long k_strides[3];
  long v_strides[3];
  long mask_strides[3];
  // gpt-oss's attention sinks: one logit a head that takes part in the softmax with no value
  // (fp32, [heads]); nullptr where the model has none.
  const float* sinks = nullptr;
};

struct Isa {
  const char* name;
  int lanes;  // fp32 lanes of one vector
  // half_gemv multiplies bf16 by bf16 in hardware (AVX512-BF16) when given x16: the products are
  // exact in fp32, so only the order of accumulation differs.
  bool bf16_dot;
  // The output rows [n0, n1) of a product with few rows of x (decoding).
  void (*quantized_gemv)(const QuantizedArgs&, int n0, int n1);
  // bf16 x (rows of k values, k a multiple of 128) as quantized_gemv's xq and xq_scales take it:
  // k values and k / 8 scales a row. nullptr where the table has no integer dot products.
  void (*prepare_int_x)(const uint16_t* x, int rows, int k, int16_t* xq, float* scales);
  // The same for several rows of x (k a multiple of 256), as 8-bit integers: twice the
  // products an instruction, with a coarser rounding of x (see int8_gemv_impl.h);
  // int8_x_bytes(rows, k) of them, and each 32 values' sum as rounded (k / 32 a row). nullptr
  // where prepare_int_x is.
  void (*prepare_int8_x)(const uint16_t* x, int rows, int k, int8_t* xq, float* sums);
  // bf16 x (k a multiple of 64) for 8-bit affine or MXFP4 (`fp4`) weights as 8-bit integers
  // (see byte_dot_impl.h): byte_x_bytes(rows, k) of them, and each 32 values' sum as rounded
  // (k / 32 a row). nullptr where the table has no integer dot products.
  void (*prepare_byte_x)(const uint16_t* x, int rows, int k, bool fp4, int8_t* xb, float* sums);
  void (*half_gemv)(const HalfArgs&, int n0, int n1);
  // Weight rows [n0, n1) as fp32, row-major into `tile` (row n0 first), for BLAS.
  void (*quantized_dequantize)(const QuantizedArgs&, int n0, int n1, float* tile);
  void (*half_widen)(const HalfArgs&, int n0, int n1, float* tile);
  // Attention for the (batch, KV head) items [item0, item1), item = b * kv_heads + g.
  void (*decode_attention)(const AttentionArgs&, int item0, int item1);
  // out[i] = silu(gate[i]) * x[i] for i in [begin, end), all three of `type`, rounded as MLX's
  // ops round each step.
  void (*silu_mul)(const void* gate, const void* x, void* out, Scalar type, std::size_t begin,
                   std::size_t end);
  // out[r] = log(sum(exp(x[r]))) for rows [r0, r1) of `n` values of `type` (out of `type`).
  void (*logsumexp_rows)(const void* x, Scalar type, int n, long r0, long r1, void* out);
  void (*argmax_rows)(const void* x, Scalar type, int n, long r0, long r1, uint32_t* out);
  // Elementwise conversions, for inputs and outputs.
  void (*to_f32)(const void* in, Scalar type, std::size_t count, float* out);
  void (*from_f32)(const float* in, Scalar type, std::size_t count, void* out);
};

extern const Isa isa_avx512bf16;
extern const Isa isa_avx512;
extern const Isa isa_avx2;
extern const Isa isa_portable;

// The table in use: the best this CPU runs, unless use_isa chose another.
const Isa& best_isa();
// Use the named table from now on; false (and no change) if this CPU cannot run it.
bool use_isa(const char* name);
// Whether this CPU (and its OS) runs the named table's instructions.
bool isa_supported(const char* name);
const Isa* isa_by_name(const char* name);

}  // namespace exo_kernels
