// The kernels as MLX primitives: lazy graph nodes with eval_cpu, so they compose with mx.eval,
// mlx-lm's generation loop and the distributed ring like any MLX op.
#pragma once

#include <optional>
#include <string>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace exo_kernels {

namespace mx = mlx::core;

// x @ dequantize(w, scales, biases).T: MLX's affine format (4 or 8 bits, groups of 32/64/128,
// with biases) or its "mxfp4" mode (4 bits, groups of 32, E8M0 scales, no biases).
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits,
                           const std::string& mode = "affine", mx::StreamOrDevice s = {});

// mx.gather_qmm(x, w, scales, biases, rhs_indices=indices, transpose=True, ...): x [..., M, K]
// by the experts `indices` name (broadcast against x's batch axes), in the formats
// quantized_matmul takes. The output is [*broadcast(x.shape[:-2], indices.shape), M, N].
mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const std::optional<mx::array>& biases,
                                  const mx::array& indices, int group_size, int bits,
                                  const std::string& mode = "affine", mx::StreamOrDevice s = {});

class CpuGatherQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  CpuGatherQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool mxfp4)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits), mxfp4_(mxfp4) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuGatherQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuGatherQuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && mxfp4_ == o.mxfp4_;
  }

 private:
  int group_size_;
  int bits_;
  bool mxfp4_;
};

// x @ w.T with w in bf16, fp16 or fp32.
mx::array dense_matmul(const mx::array& x, const mx::array& w, mx::StreamOrDevice s = {});

// mx.fast.rms_norm(x, w, eps) over the last axis, for x and w of one float type.
mx::array rms_norm(const mx::array& x, const mx::array& w, float eps, mx::StreamOrDevice s = {});

// softmax(scale * q @ k.T + mask) @ v for q [B, H, Lq, D] against k and v [B, KV heads, L, D]
// (H a multiple of the KV heads), as mx.fast.scaled_dot_product_attention; made for decoding's
// few query rows. k, v and the mask are read in place, strided as the KV cache and the mask's
// broadcast leave them. The mask is None, boolean (True attends) or additive, broadcastable to
// [B, H, Lq, L].
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, const std::optional<mx::array>& mask,
                           const std::optional<mx::array>& sinks = std::nullopt,
                           mx::StreamOrDevice s = {});

// mx.logsumexp(x, axis=-1, keepdims=True): the logits' normaliser at every sampling step,
// which MLX's CPU computes with a scalar exp.
mx::array logsumexp_last(const mx::array& x, mx::StreamOrDevice s = {});

class CpuLogSumExp : public mx::UnaryPrimitive {
 public:
  explicit CpuLogSumExp(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuLogSumExp"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// mx.argmax(x, axis=-1) as uint32: greedy sampling at every step, which MLX's CPU runs as one
// scalar loop over every logit of every row.
mx::array argmax_last(const mx::array& x, mx::StreamOrDevice s = {});

class CpuArgMax : public mx::UnaryPrimitive {
 public:
  explicit CpuArgMax(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuArgMax"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

// silu(gate) * x (mlx-lm's swiglu) in one pass, rounded as MLX's own ops round each step.
mx::array silu_mul(const mx::array& gate, const mx::array& x, mx::StreamOrDevice s = {});

class CpuSiluMul : public mx::UnaryPrimitive {
 public:
  explicit CpuSiluMul(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuSiluMul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

class CpuDecodeAttention : public mx::UnaryPrimitive {
 public:
  CpuDecodeAttention(mx::Stream stream, float scale, int mask_kind, bool sinks)
      : mx::UnaryPrimitive(stream), scale_(scale), mask_kind_(mask_kind), sinks_(sinks) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuDecodeAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuDecodeAttention&>(other);
    return scale_ == o.scale_ && mask_kind_ == o.mask_kind_ && sinks_ == o.sinks_;
  }

 private:
  float scale_;
  int mask_kind_;
  bool sinks_;
};

class CpuQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits, bool mxfp4)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits), mxfp4_(mxfp4) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int group_size_;
  int bits_;
  bool mxfp4_;
};

class CpuDenseMatmul : public mx::UnaryPrimitive {
 public:
  explicit CpuDenseMatmul(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuDenseMatmul"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

class CpuRmsNorm : public mx::UnaryPrimitive {
 public:
  CpuRmsNorm(mx::Stream stream, float eps) : mx::UnaryPrimitive(stream), eps_(eps) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuRmsNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const CpuRmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

// mx.fast.rope(x, dims, traditional=..., scale=..., offset=...) with the inverse frequencies
// given (the fallback's exp of its base, or the reciprocal of its freqs): x is [B, *, T, D], the
// offset an int scalar or one per batch entry. Rounded where MLX's CPU fallback rounds.
mx::array rope(const mx::array& x, const mx::array& inv_freqs, const mx::array& offset, int dims,
               bool traditional, float scale, mx::StreamOrDevice s = {});

class CpuRope : public mx::UnaryPrimitive {
 public:
  CpuRope(mx::Stream stream, int dims, bool traditional, float scale)
      : mx::UnaryPrimitive(stream), dims_(dims), traditional_(traditional), scale_(scale) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const CpuRope&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && scale_ == o.scale_;
  }

 private:
  int dims_;
  bool traditional_;
  float scale_;
};

}  // namespace exo_kernels
