#include "rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "half_bits.h"
#include "threads.h"

namespace exo_kernels {

namespace {

// Rows (one head at one position) below this many values run on the calling thread.
constexpr long PARALLEL_VALUES = 1 << 16;

template <Scalar T>
struct Element;
template <>
struct Element<Scalar::f32> {
  using type = float;
  static float load(float v) { return v; }
  static float round(float v) { return v; }
  static float store(float v) { return v; }
};
template <>
struct Element<Scalar::bf16> {
  using type = uint16_t;
  static float load(uint16_t v) { return bf16_to_float(v); }
  static float round(float v) { return bf16_to_float(float_to_bf16(v)); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};
template <>
struct Element<Scalar::f16> {
  using type = uint16_t;
  static float load(uint16_t v) { return f16_to_float(v); }
  static float round(float v) { return f16_to_float(float_to_f16(v)); }
  static uint16_t store(float v) { return float_to_f16(v); }
};

template <Scalar T>
void rope_typed(const RopeArgs& a) {
  using E = Element<T>;
  using V = typename E::type;
  const int half = a.dims / 2;
  const long tables = a.offset_per_batch ? a.batch : 1;
  // cos and sin of each position's angles, rounded to the type as the fallback casts them.
  std::vector<float> cos_table(static_cast<std::size_t>(tables * a.positions * half));
  std::vector<float> sin_table(cos_table.size());
  for (long b = 0; b < tables; ++b)
    for (long t = 0; t < a.positions; ++t) {
      const float position =
          (static_cast<float>(t) + static_cast<float>(a.offsets[b * a.offset_stride])) * a.scale;
      float* c = cos_table.data() + (b * a.positions + t) * half;
      float* s = sin_table.data() + (b * a.positions + t) * half;
      for (int i = 0; i < half; ++i) {
        const float theta = position * a.inv_freqs[i * a.inv_stride];
        c[i] = E::round(std::cos(theta));
        s[i] = E::round(std::sin(theta));
      }
    }
  const V* x = static_cast<const V*>(a.x);
  V* out = static_cast<V*>(a.out);
  const long rows = a.batch * a.heads * a.positions;
  const int pair = a.traditional ? 1 : half;  // where feature i's partner sits
  const int step = a.traditional ? 2 : 1;
  auto run = [&](long r0, long r1) {
    for (long r = r0; r < r1; ++r) {
      const long t = r % a.positions, n = (r / a.positions) % a.heads, b = r / (a.positions * a.heads);
      const V* in = x + b * a.strides[0] + n * a.strides[1] + t * a.strides[2];
      V* o = out + r * a.features;
      const long table = ((a.offset_per_batch ? b : 0) * a.positions + t) * half;
      const float* c = cos_table.data() + table;
      const float* s = sin_table.data() + table;
      const long f = a.strides[3];
      for (int i = 0; i < half; ++i) {
        const int j = i * step;
        const float x1 = E::load(in[j * f]), x2 = E::load(in[(j + pair) * f]);
        o[j] = E::store(E::round(x1 * c[i]) - E::round(x2 * s[i]));
        o[j + pair] = E::store(E::round(x1 * s[i]) + E::round(x2 * c[i]));
      }
      for (long i = a.dims; i < a.features; ++i) o[i] = in[i * f];
    }
  };
  const int parts = rows * a.features < PARALLEL_VALUES
                        ? 1
                        : static_cast<int>(std::min<long>(thread_count(), rows));
  if (parts <= 1) return run(0, rows);
  parallel_for(parts, [&](int part) { run(rows * part / parts, rows * (part + 1) / parts); });
}

}  // namespace

void run_rope(const RopeArgs& args) {
  switch (args.type) {
    case Scalar::f32: return rope_typed<Scalar::f32>(args);
    case Scalar::bf16: return rope_typed<Scalar::bf16>(args);
    case Scalar::f16: return rope_typed<Scalar::f16>(args);
  }
}

}  // namespace exo_kernels
