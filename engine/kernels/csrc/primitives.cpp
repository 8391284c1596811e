#include "primitives.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "matmul.h"
#include "norms.h"
#include "rope.h"
#include "threads.h"
#include "mlx/backend/cpu/encoder.h"

namespace exo_kernels {

namespace {

Scalar scalar_of(mx::Dtype dtype, const char* what) {
  if (dtype == mx::float32) return Scalar::f32;
  if (dtype == mx::bfloat16) return Scalar::bf16;
  if (dtype == mx::float16) return Scalar::f16;
  std::ostringstream message;
  message << what << " must be float32, bfloat16 or float16";
  throw std::invalid_argument(message.str());
}

mx::Shape with_last(const mx::array& x, int last) {
  mx::Shape shape = x.shape();
  shape.back() = last;
  return shape;
}

mx::Stream cpu_stream(mx::StreamOrDevice s) {
  mx::Stream stream = mx::to_stream(s);
  if (stream.device != mx::Device::cpu)
    throw std::invalid_argument("the exo-tui CPU kernels run on the CPU only");
  return stream;
}

// The output's buffer allocated and the arrays registered with the stream's encoder, as every
// eval_cpu starts.
mx::cpu::CommandEncoder& prepared_encoder(mx::Stream stream, const std::vector<mx::array>& inputs,
                                          mx::array& out) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  return encoder;
}

// An input as the kernels read it: row-major and dense. The weights (loaded, so their layout is
// known) and what the kernels make already are; a Contiguous node in front of them would copy
// nothing, but every node is an operation MLX dispatches every step (they were half of a
// decoding step's nodes), and its thread wakes for every ten of them.
mx::array row_major(const mx::array& a, mx::Stream stream) {
  const bool already = a.is_available()
                           ? a.flags().row_contiguous
                           : a.has_primitive() && dynamic_cast<const Kernel*>(&a.primitive());
  return already ? a : mx::contiguous(a, false, stream);
}

// x for a reduction over its last axis (logsumexp, argmax): a float type, a last axis with
// values, contiguous on the CPU stream.
mx::array last_axis_input(const mx::array& x, mx::Stream stream) {
  if (x.ndim() < 1 || x.shape(-1) == 0)
    throw std::invalid_argument("x needs a last axis with values");
  scalar_of(x.dtype(), "x");
  return row_major(x, stream);
}

// body(type, n, r0, r1) over x's rows (of its last axis, n values each), shared among the
// threads: inside a dispatched task of an eval_cpu.
void for_row_shares(const mx::array& x,
                    const std::function<void(Scalar type, int n, long r0, long r1)>& body) {
  const int n = x.shape(-1);
  const long rows = static_cast<long>(x.size() / n);
  if (rows == 0) return;
  const Scalar type = scalar_of(x.dtype(), "x");
  const int parts = work_parts(x.nbytes(), std::min<long>(thread_count(), rows));
  parallel_for(parts, [&](int part) {
    const long r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    if (r0 < r1) body(type, n, r0, r1);
  });
}

}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits,
                           mx::StreamOrDevice s) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  if (w.dtype() != mx::uint32 || w.ndim() != 2)
    throw std::invalid_argument("w must be a 2-D uint32 array (MLX's packed weights)");
  if (x.ndim() < 1) throw std::invalid_argument("x must have at least one dimension");
  const int n = w.shape(0);
  const int k = w.shape(1) * 32 / bits;
  if (x.shape(-1) != k) {
    std::ostringstream message;
    message << "x has " << x.shape(-1) << " features but the weights take " << k;
    throw std::invalid_argument(message.str());
  }
  const mx::Shape groups_shape{n, k / group_size};
  if (scales.shape() != groups_shape || biases.shape() != groups_shape)
    throw std::invalid_argument("scales and biases must be [rows, features / group_size]");
  if (scales.dtype() != biases.dtype())
    throw std::invalid_argument("scales and biases must share a dtype");
  scalar_of(x.dtype(), "x");
  scalar_of(scales.dtype(), "scales");
  mx::Stream stream = cpu_stream(s);
  const mx::Dtype out_type = mx::promote_types(x.dtype(), scales.dtype());
  return mx::array(
      with_last(x, n), out_type, std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits),
      {row_major(mx::astype(x, out_type, stream), stream), row_major(w, stream),
       row_major(scales, stream), row_major(biases, stream)});
}

mx::array dense_matmul(const mx::array& x, const mx::array& w, mx::StreamOrDevice s) {
  if (w.ndim() != 2 ||
      (w.dtype() != mx::bfloat16 && w.dtype() != mx::float16 && w.dtype() != mx::float32))
    throw std::invalid_argument("w must be a 2-D bfloat16, float16 or float32 array");
  if (x.ndim() < 1 || x.shape(-1) != w.shape(1)) {
    std::ostringstream message;
    message << "x's last dimension must equal w's " << w.shape(1);
    throw std::invalid_argument(message.str());
  }
  scalar_of(x.dtype(), "x");
  mx::Stream stream = cpu_stream(s);
  const mx::Dtype out_type = mx::promote_types(x.dtype(), w.dtype());
  return mx::array(with_last(x, w.shape(0)), out_type, std::make_shared<CpuDenseMatmul>(stream),
                   {row_major(mx::astype(x, out_type, stream), stream), row_major(w, stream)});
}

mx::array rms_norm(const mx::array& x, const mx::array& w, float eps, mx::StreamOrDevice s) {
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1)) {
    std::ostringstream message;
    message << "w must be one-dimensional with x's last dimension (" << (x.ndim() ? x.shape(-1) : 0)
            << ")";
    throw std::invalid_argument(message.str());
  }
  if (x.dtype() != w.dtype()) throw std::invalid_argument("x and w must share a dtype");
  scalar_of(x.dtype(), "x");
  mx::Stream stream = cpu_stream(s);
  return mx::array(x.shape(), x.dtype(), std::make_shared<CpuRmsNorm>(stream, eps),
                   {row_major(x, stream), row_major(w, stream)});
}

mx::array logsumexp_last(const mx::array& x, mx::StreamOrDevice s) {
  mx::Stream stream = cpu_stream(s);
  mx::array input = last_axis_input(x, stream);
  return mx::array(with_last(x, 1), x.dtype(), std::make_shared<CpuLogSumExp>(stream), {input});
}

void CpuLogSumExp::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    out = mx::array::unsafe_weak_copy(out)]() mutable {
    const Isa& isa = best_isa();
    for_row_shares(x, [&](Scalar type, int n, long r0, long r1) {
      isa.logsumexp_rows(x.data<void>(), type, n, r0, r1, out.data<void>());
    });
  });
}

void CpuLogSumExp::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuLogSumExp runs on the CPU only; use mx.logsumexp");
}

mx::array argmax_last(const mx::array& x, mx::StreamOrDevice s) {
  mx::Stream stream = cpu_stream(s);
  mx::array input = last_axis_input(x, stream);
  mx::Shape shape = x.shape();
  shape.pop_back();
  return mx::array(shape, mx::uint32, std::make_shared<CpuArgMax>(stream), {input});
}

void CpuArgMax::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    out = mx::array::unsafe_weak_copy(out)]() mutable {
    const Isa& isa = best_isa();
    for_row_shares(x, [&](Scalar type, int n, long r0, long r1) {
      isa.argmax_rows(x.data<void>(), type, n, r0, r1, out.data<uint32_t>());
    });
  });
}

void CpuArgMax::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuArgMax runs on the CPU only; use mx.argmax");
}

mx::array silu_mul(const mx::array& gate, const mx::array& x, mx::StreamOrDevice s) {
  if (gate.shape() != x.shape() || gate.dtype() != x.dtype())
    throw std::invalid_argument("gate and x must share a shape and a dtype");
  scalar_of(x.dtype(), "x");
  mx::Stream stream = cpu_stream(s);
  return mx::array(x.shape(), x.dtype(), std::make_shared<CpuSiluMul>(stream),
                   {row_major(gate, stream), row_major(x, stream)});
}

void CpuSiluMul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([gate = mx::array::unsafe_weak_copy(inputs[0]),
                    x = mx::array::unsafe_weak_copy(inputs[1]),
                    out = mx::array::unsafe_weak_copy(out)]() mutable {
    const std::size_t size = x.size();
    if (size == 0) return;
    const Isa& isa = best_isa();
    const Scalar type = scalar_of(x.dtype(), "x");
    // Shares of at least this many values: a thread's hand-off costs more than a smaller one.
    constexpr std::size_t SHARE = 16384;
    const int parts = static_cast<int>(std::clamp<std::size_t>(size / SHARE, 1, thread_count()));
    parallel_for(parts, [&](int part) {
      const std::size_t b = size * part / parts / 64 * 64, e = part + 1 == parts ? size : size * (part + 1) / parts / 64 * 64;
      if (b < e) isa.silu_mul(gate.data<void>(), x.data<void>(), out.data<void>(), type, b, e);
    });
  });
}

void CpuSiluMul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuSiluMul runs on the CPU only; use nn.silu(gate) * x");
}

mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& mask,
                           mx::StreamOrDevice s) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument("q, k and v must be [batch, heads, length, head dim]");
  if (k.shape() != v.shape() || q.shape(0) != k.shape(0) || q.shape(3) != k.shape(3)) {
    std::ostringstream message;
    message << "k and v must be [" << q.shape(0) << ", kv heads, keys, " << q.shape(3)
            << "], q's batch and head dim";
    throw std::invalid_argument(message.str());
  }
  if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0)
    throw std::invalid_argument("q's heads must be a multiple of k's");
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw std::invalid_argument("q, k and v must share a dtype");
  scalar_of(q.dtype(), "q");
  mx::Stream stream = cpu_stream(s);
  std::vector<mx::array> inputs{row_major(q, stream), k, v};
  int mask_kind = 0;
  if (mask.has_value()) {
    const mx::Shape full{q.shape(0), q.shape(1), q.shape(2), k.shape(2)};
    mask_kind = mask->dtype() == mx::bool_ ? 1 : 2;
    mx::array m = mask_kind == 1 ? *mask : mx::astype(*mask, mx::float32, stream);
    inputs.push_back(row_major(mx::broadcast_to(m, full, stream), stream));
  }
  return mx::array(q.shape(), q.dtype(),
                   std::make_shared<CpuDecodeAttention>(stream, scale, mask_kind),
                   std::move(inputs));
}

namespace {

// k's or v's element strides over [B, KV heads, L]; a packed copy where its rows of D are not
// contiguous (the KV cache's are, but any view may not be).
const void* strided_rows(const mx::array& a, long strides[3], std::vector<char>& copy) {
  const auto& st = a.strides();
  if (st[3] == 1 || a.shape(3) == 1) {
    for (int i = 0; i < 3; ++i) strides[i] = static_cast<long>(st[i]);
    return a.data<void>();
  }
  const long d = a.shape(3), item = static_cast<long>(a.itemsize());
  copy.resize(static_cast<std::size_t>(a.size()) * item);
  const char* base = a.data<char>();
  long at = 0;
  for (long b = 0; b < a.shape(0); ++b)
    for (long h = 0; h < a.shape(1); ++h)
      for (long j = 0; j < a.shape(2); ++j)
        for (long c = 0; c < d; ++c, ++at)
          std::memcpy(copy.data() + at * item,
                      base + (b * st[0] + h * st[1] + j * st[2] + c * st[3]) * item, item);
  strides[2] = d;
  strides[1] = d * a.shape(2);
  strides[0] = strides[1] * a.shape(1);
  return copy.data();
}

}  // namespace

void CpuDecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = prepared_encoder(stream(), inputs, out);
  std::vector<mx::array> held;
  for (const auto& input : inputs) held.push_back(mx::array::unsafe_weak_copy(input));
  encoder.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out),
                    scale = scale_, mask_kind = mask_kind_]() mutable {
    const auto& q = held[0];
    const auto& k = held[1];
    const auto& v = held[2];
    if (out.size() == 0) return;
    AttentionArgs args{};
    std::vector<char> k_copy, v_copy;
    args.q = q.data<void>();
    args.k = strided_rows(k, args.k_strides, k_copy);
    args.v = strided_rows(v, args.v_strides, v_copy);
    args.out = out.data<void>();
    args.type = scalar_of(q.dtype(), "q");
    args.mask = mask_kind != 0 ? held[3].data<void>() : nullptr;
    args.mask_kind = mask_kind;
    args.batch = q.shape(0);
    args.heads = q.shape(1);
    args.queries = q.shape(2);
    args.dim = q.shape(3);
    args.kv_heads = k.shape(1);
    args.keys = k.shape(2);
    args.scale = scale;
    const Isa& isa = best_isa();
    const int items = args.batch * args.kv_heads;
    const std::size_t bytes = static_cast<std::size_t>(items) * args.keys * args.dim * 2 *
                              mx::size_of(q.dtype());
    const int parts = work_parts(bytes, std::min(thread_count(), items));
    parallel_for(parts, [&](int part) {
      const int i0 = static_cast<int>(static_cast<long>(items) * part / parts);
      const int i1 = static_cast<int>(static_cast<long>(items) * (part + 1) / parts);
      if (i0 < i1) isa.decode_attention(args, i0, i1);
    });
  });
}

void CpuDecodeAttention::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error(
      "CpuDecodeAttention runs on the CPU only; use mx.fast.scaled_dot_product_attention");
}

mx::array rope(const mx::array& x, const mx::array& inv_freqs, const mx::array& offset, int dims,
               bool traditional, float scale, mx::StreamOrDevice s) {
  if (x.ndim() < 3) throw std::invalid_argument("x must be [batch, ..., positions, features]");
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1)) {
    std::ostringstream message;
    message << "dims must be even, positive and at most x's last dimension (" << x.shape(-1)
            << "), not " << dims;
    throw std::invalid_argument(message.str());
  }
  if (inv_freqs.ndim() != 1 || inv_freqs.shape(0) != dims / 2 || inv_freqs.dtype() != mx::float32)
    throw std::invalid_argument("inv_freqs must be dims / 2 float32 values");
  if (offset.ndim() > 1 || (offset.size() != 1 && offset.size() != static_cast<std::size_t>(x.shape(0))) ||
      !mx::issubdtype(offset.dtype(), mx::integer))
    throw std::invalid_argument("offset must be an integer scalar or one per batch entry");
  scalar_of(x.dtype(), "x");
  mx::Stream stream = cpu_stream(s);
  // The fallback's [B, N, T, D] view; a 4-D x is read in place through its strides.
  mx::array x4 = x;
  if (x.ndim() == 3) x4 = mx::expand_dims(x, 1, stream);
  else if (x.ndim() > 4) x4 = mx::flatten(x, 1, x.ndim() - 3, stream);
  return mx::array(x.shape(), x.dtype(), std::make_shared<CpuRope>(stream, dims, traditional, scale),
                   {x4, offset.dtype() == mx::int32 ? offset : mx::astype(offset, mx::int32, stream),
                    inv_freqs});
}

void CpuRope::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]),
                    offset = mx::array::unsafe_weak_copy(inputs[1]),
                    inv_freqs = mx::array::unsafe_weak_copy(inputs[2]),
                    out = mx::array::unsafe_weak_copy(out), dims = dims_,
                    traditional = traditional_, scale = scale_]() mutable {
    if (x.size() == 0) return;
    RopeArgs args{x.data<void>(), out.data<void>(), scalar_of(x.dtype(), "x"),
                  x.shape(0), x.shape(1), x.shape(2), x.shape(3),
                  {static_cast<long>(x.strides()[0]), static_cast<long>(x.strides()[1]),
                   static_cast<long>(x.strides()[2]), static_cast<long>(x.strides()[3])},
                  offset.data<int32_t>(), offset.ndim() == 1 ? static_cast<long>(offset.strides()[0]) : 0,
                  offset.size() > 1, inv_freqs.data<float>(), static_cast<long>(inv_freqs.strides()[0]),
                  dims, traditional, scale};
    run_rope(args);
  });
}

void CpuRope::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuRope runs on the CPU only; use mx.fast.rope");
}

void CpuRmsNorm::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                    out = mx::array::unsafe_weak_copy(out), eps = eps_]() mutable {
    const int d = x.shape(-1);
    if (d == 0 || x.size() == 0) return;
    run_rms_norm(x.data<void>(), w.data<void>(), out.data<void>(), scalar_of(x.dtype(), "x"),
                 static_cast<long>(x.size() / d), d, eps);
  });
}

void CpuRmsNorm::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuRmsNorm runs on the CPU only; use mx.fast.rms_norm");
}

void CpuQuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  const auto& scales = inputs[2];
  const auto& biases = inputs[3];
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                    scales = mx::array::unsafe_weak_copy(scales),
                    biases = mx::array::unsafe_weak_copy(biases),
                    out = mx::array::unsafe_weak_copy(out), group_size = group_size_,
                    bits = bits_]() mutable {
    const int n = w.shape(0);
    const int k = x.shape(-1);
    const int rows = k == 0 ? 0 : static_cast<int>(x.size() / k);
    if (rows == 0 || n == 0) return;
    run_quantized_matmul(x.data<void>(), scalar_of(x.dtype(), "x"), rows, k, w.data<uint32_t>(),
                     scales.data<void>(), biases.data<void>(), scalar_of(scales.dtype(), "scales"),
                     n, group_size, bits, out.data<void>(), scalar_of(out.dtype(), "out"));
  });
}

void CpuQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuQuantizedMatmul runs on the CPU only; use mx.quantized_matmul");
}

bool CpuQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuQuantizedMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_;
}

void CpuDenseMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const auto& x = inputs[0];
  const auto& w = inputs[1];
  auto& encoder = prepared_encoder(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(x), w = mx::array::unsafe_weak_copy(w),
                    out = mx::array::unsafe_weak_copy(out)]() mutable {
    const int n = w.shape(0);
    const int k = x.shape(-1);
    const int rows = k == 0 ? 0 : static_cast<int>(x.size() / k);
    if (rows == 0 || n == 0) return;
    run_dense_matmul(x.data<void>(), scalar_of(x.dtype(), "x"), rows, k, w.data<void>(),
                scalar_of(w.dtype(), "w"), n, out.data<void>(), scalar_of(out.dtype(), "out"));
  });
}

void CpuDenseMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuDenseMatmul runs on the CPU only; use a matmul");
}

}  // namespace exo_kernels
