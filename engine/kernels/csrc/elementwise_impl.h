// Elementwise kernels, once per instruction set: isa_impl.h includes this inside its namespace,
// after to_f32 and from_f32. MLX's CPU runs these as chains of generic ops with a scalar exp.

inline vf select(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

// 2^n e^r for x in [-87, 88] and n = round(x / ln 2): r = x - n ln 2 in two parts (Cody and
// Waite), |r| <= ln 2 / 2, and a degree-7 Taylor polynomial for e^r.
inline vf exp_reduced(vf x, vi n) {
  const vf nf = __builtin_convertvector(n, vf);
  const vf r = (x - nf * 0.693145752f) - nf * 1.42860677e-6f;
  vf p = vf{} + (1.0f / 5040.0f);
  p = p * r + (1.0f / 720.0f);
  p = p * r + (1.0f / 120.0f);
  p = p * r + (1.0f / 24.0f);
  p = p * r + (1.0f / 6.0f);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * (vf)((n + 127) << 23);
}

// e^x for x <= 0 (scores less their maximum), within an ulp or two of expf. Below -87 (a
// masked key's -inf included) it is exactly 0, as expf's result rounds to there.
inline vf exp_nonpositive(vf x) {
  const vi dead = x < -87.0f;
  x = select(dead, vf{} - 87.0f, x);
  const vi n = __builtin_convertvector(x * 1.44269504f - 0.5f, vi);  // round to nearest, x <= 0
  return select(dead, vf{}, exp_reduced(x, n));
}

// fp32 lanes rounded to bf16 (to nearest even; NaN stays NaN) or fp16, and back to fp32.
template <typename H>
inline vf round_to(vf v) {
  if constexpr (std::is_same_v<H, float>) {
    return v;
  } else if constexpr (std::is_same_v<H, bf16>) {
    const vu u = (vu)v;
    const vu even = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const vi nan = (vi)((u & 0x7fffffffu) > 0x7f800000u);
    return (vf)(vu)select(nan, (vf)((u | 0x00400000u) & 0xffff0000u), (vf)even);
  } else {
    alignas(64) float lanes[L];
    alignas(64) uint16_t halves[L];
    store(lanes, v);
    from_f32(lanes, Scalar::f16, L, halves);
    return load_f16(halves);
  }
}

// e^x for any x, infinite past the largest float.
inline vf exp_any(vf x) {
  const vi dead = x < -87.0f, huge = x > 88.7f;
  x = select(dead, vf{} - 87.0f, select(huge, vf{} + 88.0f, x));
  const vf half = select(x < 0.0f, vf{} - 0.5f, vf{} + 0.5f);
  const vi n = __builtin_convertvector(x * 1.44269504f + half, vi);  // round to nearest
  return select(dead, vf{}, select(huge, vf{} + INFINITY, exp_reduced(x, n)));
}

// MLX's sigmoid: y = 1 / (1 + e^|x|), with e^|x| rounded to the type and the rest in fp32,
// then y for x < 0 and 1 - y otherwise, rounded (checked against mx.sigmoid over every fp16
// and bf16 value); its silu then rounds the products with gate and with x.
template <typename H>
inline vf silu_times(vf g, vf x) {
  const vf magnitude = (vf)((vu)g & 0x7fffffffu);
  const vf y = 1.0f / (1.0f + round_to<H>(exp_any(magnitude)));
  const vf sigmoid = round_to<H>(select((vi)(g < vf{}), y, 1.0f - y));
  return round_to<H>(round_to<H>(g * sigmoid) * x);
}

void silu_mul(const void* gate, const void* x, void* out, Scalar type, std::size_t begin,
              std::size_t end) {
  alignas(64) float g32[L], x32[L], o32[L];
  const std::size_t size = type == Scalar::f32 ? 4 : 2;
  auto at = [size](const void* base, std::size_t i) { return static_cast<const char*>(base) + i * size; };
  for (std::size_t i = begin; i < end; i += L) {
    const std::size_t count = std::min<std::size_t>(L, end - i);
    std::fill(g32, g32 + L, 0.0f);
    std::fill(x32, x32 + L, 0.0f);
    to_f32(at(gate, i), type, count, g32);
    to_f32(at(x, i), type, count, x32);
    vf result;
    if (type == Scalar::bf16) result = silu_times<bf16>(load(g32), load(x32));
    else if (type == Scalar::f16) result = silu_times<f16>(load(g32), load(x32));
    else result = silu_times<float>(load(g32), load(x32));
    store(o32, result);
    from_f32(o32, type, count, static_cast<char*>(out) + i * size);
  }
}

// Row r of x (rows of `n` values of `type`) in fp32, in a buffer of this thread's (valid until
// its next call).
const float* row_as_f32(const void* x, Scalar type, int n, long r) {
  const std::size_t size = type == Scalar::f32 ? 4 : 2;
  thread_local std::vector<float> row;
  row.resize(static_cast<std::size_t>(n) + L);
  to_f32(static_cast<const char*>(x) + static_cast<std::size_t>(r) * n * size, type,
         static_cast<std::size_t>(n), row.data());
  return row.data();
}

// The largest of `n` values, NaNs passed over (-inf where there are no others); `nan` is set
// to whether there was one.
float largest(const float* row, int n, bool& nan) {
  vf tops = vf{} - INFINITY;
  vi nans = vi{};
  int i = 0;
  for (; i + L <= n; i += L) {
    const vf v = load(row + i);
    tops = select(v > tops, v, tops);  // (false for a NaN)
    nans |= v != v;
  }
  float top = -INFINITY;
  nan = false;
  for (int l = 0; l < L; ++l) {
    top = std::max(top, tops[l]);
    nan = nan || nans[l] != 0;
  }
  for (; i < n; ++i) {
    top = row[i] > top ? row[i] : top;
    nan = nan || std::isnan(row[i]);
  }
  return top;
}

// The index of each row's largest value, rows [r0, r1) of `n` values, as MLX's argmax gives it:
// the first of equal largest values, and a NaN counts as larger than any (the first NaN's).
void argmax_rows(const void* x, Scalar type, int n, long r0, long r1, uint32_t* out) {
  for (long r = r0; r < r1; ++r) {
    const float* row = row_as_f32(x, type, n, r);
    bool nan = false;
    const float top = largest(row, n, nan);
    uint32_t at = 0;  // the row holds a NaN, or top, so each search ends within it
    if (nan)
      while (!std::isnan(row[at])) ++at;
    else
      while (!(row[at] == top)) ++at;
    out[r] = at;
  }
}

// log(sum(exp(x))) of each row of `n` values, rows [r0, r1), in fp32 (the largest value taken
// out first), each rounded once to `type` into out[row].
void logsumexp_rows(const void* x, Scalar type, int n, long r0, long r1, void* out) {
  const std::size_t size = type == Scalar::f32 ? 4 : 2;
  for (long r = r0; r < r1; ++r) {
    const float* row = row_as_f32(x, type, n, r);
    bool nan = false;  // (a NaN gives NaN through the sum)
    const float top = largest(row, n, nan);
    float total = 0.0f;
    if (std::isfinite(top)) {
      // Four sums side by side: a long row's rounding grows with the additions each takes.
      vf sums[4] = {};
      int i = 0;
      for (; i + 4 * L <= n; i += 4 * L)
        for (int s = 0; s < 4; ++s) sums[s] += exp_nonpositive(load(row + i + s * L) - top);
      for (; i + L <= n; i += L) sums[0] += exp_nonpositive(load(row + i) - top);
      total = hsum((sums[0] + sums[1]) + (sums[2] + sums[3]));
      for (; i < n; ++i) total += std::exp(row[i] - top);
    }
    // A row of -inf gives -inf, one holding +inf or NaN gives it back, as MLX's does.
    const float result = std::isfinite(top) ? top + std::log(total) : top;
    from_f32(&result, type, 1, static_cast<char*>(out) + static_cast<std::size_t>(r) * size);
  }
}
