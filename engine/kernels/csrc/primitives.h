// The kernels as MLX primitives: lazy graph nodes with eval_cpu, so they compose with mx.eval,
// mlx-lm's generation loop and the distributed ring like any MLX op.
#pragma once

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace exo_kernels {

namespace mx = mlx::core;

// x @ dequantize(w, scales, biases).T, MLX's affine format (4 or 8 bits, groups of 32/64/128).
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits,
                           mx::StreamOrDevice s = {});

// x @ w.T with w in bf16 or fp16.
mx::array half_matmul(const mx::array& x, const mx::array& w, mx::StreamOrDevice s = {});

// mx.fast.rms_norm(x, w, eps) over the last axis, for x and w of one float type.
mx::array rms_norm(const mx::array& x, const mx::array& w, float eps, mx::StreamOrDevice s = {});

class CpuQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  CpuQuantizedMatmul(mx::Stream stream, int group_size, int bits)
      : mx::UnaryPrimitive(stream), group_size_(group_size), bits_(bits) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuQuantizedMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override;

 private:
  int group_size_;
  int bits_;
};

class CpuHalfMatmul : public mx::UnaryPrimitive {
 public:
  explicit CpuHalfMatmul(mx::Stream stream) : mx::UnaryPrimitive(stream) {}
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  const char* name() const override { return "CpuHalfMatmul"; }
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

}  // namespace exo_kernels
