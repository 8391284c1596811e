#include "primitives.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
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

// dst (row-major, src's shape) = src, read through src's strides: a run of its last axis at a
// time where that axis is contiguous.
void copy_to_row_major(const mx::array& src, char* dst) {
  const int ndim = static_cast<int>(src.ndim());
  const std::size_t item = src.itemsize();
  if (ndim == 0 || src.size() == 0) {
    if (src.size() != 0) std::memcpy(dst, src.data<char>(), item);
    return;
  }
  const long last = src.shape(-1), last_stride = static_cast<long>(src.strides()[ndim - 1]);
  const long runs = static_cast<long>(src.size()) / last;
  const char* base = src.data<char>();
  for (long run = 0; run < runs; ++run) {
    long at = 0, rest = run;  // the run's element offset in src, from its index
    for (int axis = ndim - 2; axis >= 0; --axis) {
      at += (rest % src.shape(axis)) * static_cast<long>(src.strides()[axis]);
      rest /= src.shape(axis);
    }
    char* to = dst + static_cast<std::size_t>(run * last) * item;
    if (last_stride == 1) {
      std::memcpy(to, base + at * static_cast<long>(item), static_cast<std::size_t>(last) * item);
    } else {
      for (long i = 0; i < last; ++i)
        std::memcpy(to + i * static_cast<long>(item),
                    base + (at + i * last_stride) * static_cast<long>(item), item);
    }
  }
}

// An input as the kernels read it: row-major and dense. Where it is already (the weights, what
// the kernels and MLX's elementwise ops make, reshapes of those) it is used as it is; otherwise
// (a transpose's or a broadcast's view) a row-major copy is made on the stream first. Deciding
// here, when the layout is known, spares the graph a Contiguous node in front of each kernel: a
// node MLX dispatches every step even where it copies nothing (they were a tenth of a decoding
// step's nodes).
mx::array row_major_input(const mx::array& in, mx::cpu::CommandEncoder& encoder) {
  if (in.flags().row_contiguous) return in;
  mx::array copy(in.shape(), in.dtype(), nullptr, {});
  copy.set_data(mx::allocator::malloc(copy.nbytes()));
  encoder.add_temporary(copy);
  encoder.dispatch([src = mx::array::unsafe_weak_copy(in),
                    dst = mx::array::unsafe_weak_copy(copy)]() mutable {
    copy_to_row_major(src, dst.data<char>());
  });
  return copy;
}

// How every eval_cpu starts: the output's buffer allocated, the arrays registered with the
// stream's encoder, and the first `dense` inputs row-major (row_major_input), the rest as they
// are (read through their strides).
struct Prepared {
  mx::cpu::CommandEncoder& encoder;
  std::vector<mx::array> in;
};

Prepared prepare(mx::Stream stream, const std::vector<mx::array>& inputs, mx::array& out,
                 std::size_t dense = SIZE_MAX) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& input : inputs) encoder.set_input_array(input);
  encoder.set_output_array(out);
  std::vector<mx::array> in;
  in.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    in.push_back(i < dense ? row_major_input(inputs[i], encoder) : inputs[i]);
  return {encoder, std::move(in)};
}

// x for a reduction over its last axis (logsumexp, argmax), checked: a float type and a last
// axis with values (the kernel makes it row-major when it runs, see prepare).
mx::array last_axis_input(const mx::array& x) {
  if (x.ndim() < 1 || x.shape(-1) == 0)
    throw std::invalid_argument("x needs a last axis with values");
  scalar_of(x.dtype(), "x");
  return x;
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

// An expert index out of range (a router's bug, or a model file's) is never read: its products
// are NaN, and stderr says so once. (An exception cannot leave a task on MLX's stream.)
void note_refused_experts(long pairs, int experts) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "exo-tui kernels: %ld expert products named an expert outside 0..%d or a row "
               "outside x; their outputs are NaN\n",
               pairs, experts - 1);
}

}  // namespace

namespace {

// The weights' format, checked: whether it is MXFP4, and the output's type for x.
struct QuantizedFormat {
  bool mxfp4;
  mx::Dtype out_type;
};

QuantizedFormat check_quantized(const mx::array& x, const mx::array& w, const mx::array& scales,
                                const std::optional<mx::array>& biases, int group_size, int bits,
                                const std::string& mode, int w_ndim) {
  const bool mxfp4 = mode == "mxfp4";
  if (mode != "affine" && !mxfp4)
    throw std::invalid_argument("mode must be 'affine' or 'mxfp4' (MLX's others run on MLX)");
  if (mxfp4 && (bits != 4 || group_size != 32))
    throw std::invalid_argument("mxfp4 weights are 4 bits in groups of 32");
  if (bits != 4 && bits != 8) throw std::invalid_argument("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("group_size must be 32, 64 or 128");
  if (w.dtype() != mx::uint32 || static_cast<int>(w.ndim()) != w_ndim) {
    std::ostringstream message;
    message << "w must be a " << w_ndim << "-D uint32 array (MLX's packed weights)";
    throw std::invalid_argument(message.str());
  }
  if (x.ndim() < 1) throw std::invalid_argument("x must have at least one dimension");
  const int k = w.shape(-1) * 32 / bits;
  if (x.shape(-1) != k) {
    std::ostringstream message;
    message << "x has " << x.shape(-1) << " features but the weights take " << k;
    throw std::invalid_argument(message.str());
  }
  mx::Shape groups_shape = w.shape();
  groups_shape.back() = k / group_size;
  if (scales.shape() != groups_shape || (biases && biases->shape() != groups_shape))
    throw std::invalid_argument("scales and biases must be [..., rows, features / group_size]");
  scalar_of(x.dtype(), "x");
  if (mxfp4) {
    if (biases) throw std::invalid_argument("mxfp4 weights have no biases");
    if (scales.dtype() != mx::uint8)
      throw std::invalid_argument("mxfp4 scales must be uint8 (E8M0)");
    return {true, x.dtype()};
  }
  if (!biases) throw std::invalid_argument("affine weights need their biases");
  if (scales.dtype() != biases->dtype())
    throw std::invalid_argument("scales and biases must share a dtype");
  scalar_of(scales.dtype(), "scales");
  return {false, mx::promote_types(x.dtype(), scales.dtype())};
}

std::vector<mx::array> weight_inputs(const mx::array& w, const mx::array& scales,
                                     const std::optional<mx::array>& biases) {
  std::vector<mx::array> inputs{w, scales};
  if (biases) inputs.push_back(*biases);
  return inputs;
}

}  // namespace

mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           const std::string& mode, mx::StreamOrDevice s) {
  const QuantizedFormat format = check_quantized(x, w, scales, biases, group_size, bits, mode, 2);
  mx::Stream stream = cpu_stream(s);
  std::vector<mx::array> inputs{mx::astype(x, format.out_type, stream)};
  for (auto& input : weight_inputs(w, scales, biases)) inputs.push_back(input);
  return mx::array(
      with_last(x, w.shape(0)), format.out_type,
      std::make_shared<CpuQuantizedMatmul>(stream, group_size, bits, format.mxfp4), inputs);
}

mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const std::optional<mx::array>& biases,
                                  const mx::array& indices, int group_size, int bits,
                                  const std::string& mode, mx::StreamOrDevice s) {
  const QuantizedFormat format = check_quantized(x, w, scales, biases, group_size, bits, mode, 3);
  if (x.ndim() < 2) throw std::invalid_argument("x must be [..., rows, features]");
  if (!mx::issubdtype(indices.dtype(), mx::integer))
    throw std::invalid_argument("indices must be integers (the experts' numbers)");
  mx::Stream stream = cpu_stream(s);
  const mx::Shape x_batch(x.shape().begin(), x.shape().end() - 2);
  mx::Shape shape = mx::broadcast_shapes(x_batch, indices.shape());
  shape.push_back(x.shape(-2));
  shape.push_back(w.shape(1));
  // The indices go last: they are read through their strides (a broadcast's view copies
  // nothing), and negative ones come out out of range as uint32.
  std::vector<mx::array> inputs{mx::astype(x, format.out_type, stream)};
  for (auto& input : weight_inputs(w, scales, biases)) inputs.push_back(input);
  inputs.push_back(mx::astype(indices, mx::uint32, stream));
  return mx::array(
      shape, format.out_type,
      std::make_shared<CpuGatherQuantizedMatmul>(stream, group_size, bits, format.mxfp4), inputs);
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
                   {mx::astype(x, out_type, stream), w});
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
                   {x, w});
}

mx::array logsumexp_last(const mx::array& x, mx::StreamOrDevice s) {
  mx::Stream stream = cpu_stream(s);
  mx::array input = last_axis_input(x);
  return mx::array(with_last(x, 1), x.dtype(), std::make_shared<CpuLogSumExp>(stream), {input});
}

void CpuLogSumExp::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto [encoder, in] = prepare(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(in[0]),
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
  mx::array input = last_axis_input(x);
  mx::Shape shape = x.shape();
  shape.pop_back();
  return mx::array(shape, mx::uint32, std::make_shared<CpuArgMax>(stream), {input});
}

void CpuArgMax::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto [encoder, in] = prepare(stream(), inputs, out);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(in[0]),
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
                   {gate, x});
}

void CpuSiluMul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto [encoder, in] = prepare(stream(), inputs, out);
  encoder.dispatch([gate = mx::array::unsafe_weak_copy(in[0]),
                    x = mx::array::unsafe_weak_copy(in[1]),
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
                           const std::optional<mx::array>& sinks, mx::StreamOrDevice s) {
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
  std::vector<mx::array> inputs{q, k, v};
  int mask_kind = 0;
  if (mask.has_value()) {
    // Read in place through its strides, broadcast ones included (leading_strides).
    const mx::Shape full{q.shape(0), q.shape(1), q.shape(2), k.shape(2)};
    const int extra = static_cast<int>(mask->ndim()) - 4;
    bool fits = mask->ndim() >= 1 && extra <= 0;
    for (int axis = 0; fits && axis < static_cast<int>(mask->ndim()); ++axis) {
      const int size = mask->shape(axis), want = full[axis - extra];
      fits = size == want || size == 1;
    }
    if (!fits) throw std::invalid_argument("the mask must broadcast to [batch, heads, queries, keys]");
    mask_kind = mask->dtype() == mx::bool_ ? 1 : 2;
    inputs.push_back(mask_kind == 1 ? *mask : mx::astype(*mask, mx::float32, stream));
  }
  if (sinks.has_value()) {
    if (sinks->ndim() != 1 || sinks->shape(0) != q.shape(1))
      throw std::invalid_argument("sinks must be one logit a head: [heads]");
    inputs.push_back(mx::astype(*sinks, mx::float32, stream));  // row-major (prepare)
  }
  return mx::array(q.shape(), q.dtype(),
                   std::make_shared<CpuDecodeAttention>(stream, scale, mask_kind,
                                                        sinks.has_value()),
                   std::move(inputs));
}

namespace {

// `in` with its last axis contiguous: as it is where it already is (the KV cache, a broadcast
// mask), else a row-major copy (row_major_input).
mx::array last_axis_contiguous(const mx::array& in, mx::cpu::CommandEncoder& encoder) {
  return in.shape(-1) > 1 && in.strides().back() != 1 ? row_major_input(in, encoder) : in;
}

// a's element strides over the first three axes of the 4 it broadcasts to ([B, KV heads, L] of
// k and v, [B, H, Lq] of the mask): 0 where it has no such axis or one of size 1.
void leading_strides(const mx::array& a, long strides[3]) {
  const int extra = 4 - static_cast<int>(a.ndim());
  for (int axis = 0; axis < 3; ++axis) {
    const int own = axis - extra;
    strides[axis] = own >= 0 && a.shape(own) > 1 ? static_cast<long>(a.strides()[own]) : 0;
  }
}

}  // namespace

void CpuDecodeAttention::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto [encoder, in] = prepare(stream(), inputs, out, 1);  // q; k, v and the mask by strides
  for (std::size_t i = 1; i < in.size(); ++i) in[i] = last_axis_contiguous(in[i], encoder);
  std::vector<mx::array> held;
  for (const auto& input : in) held.push_back(mx::array::unsafe_weak_copy(input));
  encoder.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out),
                    scale = scale_, mask_kind = mask_kind_, sinks = sinks_]() mutable {
    const auto& q = held[0];
    const auto& k = held[1];
    const auto& v = held[2];
    if (out.size() == 0) return;
    AttentionArgs args{};
    args.q = q.data<void>();
    args.k = k.data<void>();
    args.v = v.data<void>();
    leading_strides(k, args.k_strides);
    leading_strides(v, args.v_strides);
    args.out = out.data<void>();
    args.type = scalar_of(q.dtype(), "q");
    args.mask = mask_kind != 0 ? held[3].data<void>() : nullptr;
    args.mask_kind = mask_kind;
    if (mask_kind != 0) leading_strides(held[3], args.mask_strides);
    args.batch = q.shape(0);
    args.heads = q.shape(1);
    args.queries = q.shape(2);
    args.dim = q.shape(3);
    args.kv_heads = k.shape(1);
    args.keys = k.shape(2);
    args.scale = scale;
    if (sinks) args.sinks = held.back().data<float>();
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
  auto [encoder, in] = prepare(stream(), inputs, out, 0);  // read through their strides
  encoder.dispatch([x = mx::array::unsafe_weak_copy(in[0]),
                    offset = mx::array::unsafe_weak_copy(in[1]),
                    inv_freqs = mx::array::unsafe_weak_copy(in[2]),
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
  auto [encoder, in] = prepare(stream(), inputs, out);
  const auto& x = in[0];
  const auto& w = in[1];
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
  auto [encoder, in] = prepare(stream(), inputs, out);
  const mx::array none(0.0f);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                    scales = mx::array::unsafe_weak_copy(in[2]),
                    biases = mx::array::unsafe_weak_copy(mxfp4_ ? none : in[3]),
                    out = mx::array::unsafe_weak_copy(out), group_size = group_size_,
                    bits = bits_, mxfp4 = mxfp4_]() mutable {
    const int n = w.shape(0);
    const int k = x.shape(-1);
    const int rows = k == 0 ? 0 : static_cast<int>(x.size() / k);
    if (rows == 0 || n == 0) return;
    run_quantized_matmul(x.data<void>(), scalar_of(x.dtype(), "x"), rows, k, w.data<uint32_t>(),
                         scales.data<void>(), mxfp4 ? nullptr : biases.data<void>(),
                         mxfp4 ? Scalar::f32 : scalar_of(scales.dtype(), "scales"), n,
                         group_size, bits, mxfp4, out.data<void>(), scalar_of(out.dtype(), "out"));
  });
}

void CpuGatherQuantizedMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  const std::size_t weights = mxfp4_ ? 2 : 3;
  auto [encoder, in] = prepare(stream(), inputs, out, 1 + weights);
  const mx::array none(0.0f);
  encoder.dispatch([x = mx::array::unsafe_weak_copy(in[0]), w = mx::array::unsafe_weak_copy(in[1]),
                    scales = mx::array::unsafe_weak_copy(in[2]),
                    biases = mx::array::unsafe_weak_copy(mxfp4_ ? none : in[3]),
                    indices = mx::array::unsafe_weak_copy(in[1 + weights]),
                    out = mx::array::unsafe_weak_copy(out), group_size = group_size_,
                    bits = bits_, mxfp4 = mxfp4_]() mutable {
    const int m = x.shape(-2), k = x.shape(-1), n = w.shape(1), experts = w.shape(0);
    // Each output matrix's row of x and expert, x and the indices broadcast to the output's
    // batch axes (a size-1 or missing axis repeats).
    const int batch_axes = static_cast<int>(out.ndim()) - 2;
    long pairs = 1;
    for (int a = 0; a < batch_axes; ++a) pairs *= out.shape(a);
    if (pairs == 0 || m == 0 || n == 0) return;
    std::vector<uint32_t> xi(static_cast<std::size_t>(pairs)), e(static_cast<std::size_t>(pairs));
    const int x_axes = static_cast<int>(x.ndim()) - 2, i_axes = static_cast<int>(indices.ndim());
    const uint32_t* index = indices.data<uint32_t>();
    for (long t = 0; t < pairs; ++t) {
      long rest = t, x_at = 0, x_step = 1, i_at = 0;
      for (int a = batch_axes - 1; a >= 0; --a) {
        const long at = rest % out.shape(a);
        rest /= out.shape(a);
        const int xa = a - (batch_axes - x_axes), ia = a - (batch_axes - i_axes);
        if (xa >= 0) {
          if (x.shape(xa) != 1) x_at += at * x_step;
          x_step *= x.shape(xa);
        }
        if (ia >= 0 && indices.shape(ia) != 1) i_at += at * static_cast<long>(indices.strides()[ia]);
      }
      xi[static_cast<std::size_t>(t)] = static_cast<uint32_t>(x_at);
      e[static_cast<std::size_t>(t)] = index[i_at];
    }
    const int x_count = k == 0 || m == 0 ? 0 : static_cast<int>(x.size() / (static_cast<std::size_t>(m) * k));
    const long refused = run_gather_quantized_matmul(
        x.data<void>(), scalar_of(x.dtype(), "x"), m, k, xi.data(), e.data(),
        static_cast<int>(pairs), x_count, experts, w.data<uint32_t>(), scales.data<void>(),
        mxfp4 ? nullptr : biases.data<void>(),
        mxfp4 ? Scalar::f32 : scalar_of(scales.dtype(), "scales"), n, group_size, bits, mxfp4,
        out.data<void>(), scalar_of(out.dtype(), "out"));
    if (refused > 0) note_refused_experts(refused, experts);
  });
}

void CpuGatherQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuGatherQuantizedMatmul runs on the CPU only; use mx.gather_qmm");
}

void CpuQuantizedMatmul::eval_gpu(const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("CpuQuantizedMatmul runs on the CPU only; use mx.quantized_matmul");
}

bool CpuQuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const CpuQuantizedMatmul&>(other);
  return group_size_ == o.group_size_ && bits_ == o.bits_ && mxfp4_ == o.mxfp4_;
}

void CpuDenseMatmul::eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) {
  auto [encoder, in] = prepare(stream(), inputs, out);
  const auto& x = in[0];
  const auto& w = in[1];
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
