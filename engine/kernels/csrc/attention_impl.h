// Attention for decoding (a few query rows a head against the KV cache), in fp32, once per
// instruction set: isa_impl.h includes this inside its namespace, after to_f32, from_f32 and
// elementwise_impl.h.
// MLX's CPU scaled_dot_product_attention runs such a call as generic ops with a scalar exp,
// many times the arithmetic; here each key and value row is read once for all the query heads
// that share it.

// One row of `d` values of `type` at `in` as fp32 into `out`, padded with zeros to `padded`.
inline void row_to_f32(const void* in, Scalar type, int d, int padded, float* out) {
  to_f32(in, type, static_cast<std::size_t>(d), out);
  for (int i = d; i < padded; ++i) out[i] = 0.0f;
}

inline const char* element(const void* base, Scalar type, long index) {
  return static_cast<const char*>(base) + index * (type == Scalar::f32 ? 4 : 2);
}

void decode_attention(const AttentionArgs& a, int item0, int item1) {
  const int repeat = a.heads / a.kv_heads, rows = repeat * a.queries;
  const int keys = a.keys, d = a.dim, padded = (d + L - 1) / L * L, chunks = padded / L;
  thread_local std::vector<float> queries, scores, sums, row;
  queries.resize(static_cast<std::size_t>(rows) * padded);
  scores.resize(static_cast<std::size_t>(rows) * keys);
  sums.resize(static_cast<std::size_t>(rows) * padded);
  row.resize(padded);
  for (int item = item0; item < item1; ++item) {
    const int b = item / a.kv_heads, g = item % a.kv_heads;
    // Row i: head g * repeat + i / queries, query i % queries, at [b, head, query] of q and out.
    auto at = [&](int i) {
      const long head = static_cast<long>(g) * repeat + i / a.queries;
      return (static_cast<long>(b) * a.heads + head) * a.queries + i % a.queries;
    };
    for (int i = 0; i < rows; ++i) {
      float* q = queries.data() + static_cast<std::size_t>(i) * padded;
      row_to_f32(element(a.q, a.type, at(i) * d), a.type, d, padded, q);
      for (int c = 0; c < padded; ++c) q[c] *= a.scale;
    }
    const long k0 = b * a.k_strides[0] + g * a.k_strides[1];
    const long v0 = b * a.v_strides[0] + g * a.v_strides[1];
    for (int j = 0; j < keys; ++j) {
      row_to_f32(element(a.k, a.type, k0 + j * a.k_strides[2]), a.type, d, padded, row.data());
      for (int i = 0; i < rows; ++i) {
        const float* q = queries.data() + static_cast<std::size_t>(i) * padded;
        vf acc = {};
        for (int c = 0; c < chunks; ++c) acc += load(q + c * L) * load(row.data() + c * L);
        scores[static_cast<std::size_t>(i) * keys + j] = hsum(acc);
      }
    }
    std::vector<float> totals(rows);
    // Row i's mask: its rows of keys through the mask's strides (0 on a broadcast axis).
    auto mask_at = [&](int i) {
      const long head = static_cast<long>(g) * repeat + i / a.queries;
      return b * a.mask_strides[0] + head * a.mask_strides[1] + (i % a.queries) * a.mask_strides[2];
    };
    for (int i = 0; i < rows; ++i) {
      float* s = scores.data() + static_cast<std::size_t>(i) * keys;
      if (a.mask_kind == 1) {
        const uint8_t* m = static_cast<const uint8_t*>(a.mask) + mask_at(i);
        for (int j = 0; j < keys; ++j)
          if (m[j] == 0) s[j] = -INFINITY;
      } else if (a.mask_kind == 2) {
        const float* m = static_cast<const float*>(a.mask) + mask_at(i);
        for (int j = 0; j < keys; ++j) s[j] += m[j];
      }
      // A sink is one more logit in the softmax, with no value to add.
      const float sink =
          a.sinks == nullptr ? -INFINITY : a.sinks[static_cast<long>(g) * repeat + i / a.queries];
      float top = sink;
      for (int j = 0; j < keys; ++j) top = std::max(top, s[j]);
      float total = a.sinks == nullptr ? 0.0f : std::exp(sink - top);
      int j = 0;
      for (; j + L <= keys; j += L) {
        const vf e = exp_nonpositive(load(s + j) - top);
        store(s + j, e);
        total += hsum(e);
      }
      for (; j < keys; ++j) {
        s[j] = std::exp(s[j] - top);
        total += s[j];
      }
      totals[i] = total;
    }
    std::fill(sums.begin(), sums.end(), 0.0f);
    for (int j = 0; j < keys; ++j) {
      row_to_f32(element(a.v, a.type, v0 + j * a.v_strides[2]), a.type, d, padded, row.data());
      for (int i = 0; i < rows; ++i) {
        float* o = sums.data() + static_cast<std::size_t>(i) * padded;
        const float p = scores[static_cast<std::size_t>(i) * keys + j];
        for (int c = 0; c < chunks; ++c) store(o + c * L, load(o + c * L) + p * load(row.data() + c * L));
      }
    }
    for (int i = 0; i < rows; ++i) {
      float* o = sums.data() + static_cast<std::size_t>(i) * padded;
      const float inverse = 1.0f / totals[i];
      for (int c = 0; c < d; ++c) o[c] *= inverse;
      char* out = static_cast<char*>(a.out) + at(i) * d * (a.type == Scalar::f32 ? 4 : 2);
      from_f32(o, a.type, static_cast<std::size_t>(d), out);
    }
  }
}
