#include "norms.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "half_bits.h"

namespace exo_kernels {

namespace {

template <Scalar T>
struct Element;
template <>
struct Element<Scalar::f32> {
  using type = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
template <>
struct Element<Scalar::bf16> {
  using type = uint16_t;
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};
template <>
struct Element<Scalar::f16> {
  using type = uint16_t;
  static float load(uint16_t v) { return f16_to_float(v); }
  static uint16_t store(float v) { return float_to_f16(v); }
};

template <Scalar T>
void rows_of(const void* x_in, const void* w_in, void* out_in, long rows, int d, float eps) {
  using E = Element<T>;
  using V = typename E::type;
  const V* x = static_cast<const V*>(x_in);
  const V* w = static_cast<const V*>(w_in);
  V* out = static_cast<V*>(out_in);
  std::vector<float> weight(d);
  for (int i = 0; i < d; ++i) weight[i] = E::load(w[i]);
  std::vector<float> row(d);
  for (long r = 0; r < rows; ++r) {
    const V* xr = x + r * d;
    V* o = out + r * d;
    float sum = 0.0f;
    for (int i = 0; i < d; ++i) {
      row[i] = E::load(xr[i]);
      sum += row[i] * row[i];
    }
    const float scale = 1.0f / std::sqrt(sum * (1.0f / static_cast<float>(d)) + eps);
    for (int i = 0; i < d; ++i) o[i] = E::store(E::load(E::store(row[i] * scale)) * weight[i]);
  }
}

}  // namespace

void run_rms_norm(const void* x, const void* w, void* out, Scalar type, long rows, int d,
                  float eps) {
  switch (type) {
    case Scalar::f32: return rows_of<Scalar::f32>(x, w, out, rows, d, eps);
    case Scalar::bf16: return rows_of<Scalar::bf16>(x, w, out, rows, d, eps);
    case Scalar::f16: return rows_of<Scalar::f16>(x, w, out, rows, d, eps);
  }
}

}  // namespace exo_kernels
