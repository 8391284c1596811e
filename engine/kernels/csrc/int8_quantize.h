// x's rounding to 8-bit integers, 64 values at a time: the 8-bit GEMV's (int8_gemv_impl.h) and
// AMX's 8-bit tiles' (amx_int8.cpp), so that both paths give the same integers. Included inside
// the includer's namespace, after <immintrin.h> and <limits>, with AVX-512F enabled.

// 64 values of x quantized for prepare_int8_x: each 64 values' largest magnitude to 127, their
// step (NaN where one is not finite, 0 where all are under 1e-34, which counts as 0), and
// each 32's even and odd values as 16 integers.
struct Int8Block {
  __m512i even[2], odd[2];
  float step;
};

inline Int8Block quantize_64(const uint16_t* x) {
  const __m512 largest = _mm512_set1_ps(3.4028235e38f);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 even[2], odd[2];
  __m512 top = _mm512_setzero_ps();
  bool finite = true;
  for (int i = 0; i < 2; ++i) {
    // 32 bf16 values as 16 pairs: a pair's even value in its low half, its odd in its high.
    const __m512i pairs = _mm512_loadu_si512(x + 32 * i);
    even[i] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    odd[i] = _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half));
    const __m512 a0 = _mm512_abs_ps(even[i]), a1 = _mm512_abs_ps(odd[i]);
    finite = finite && (_mm512_cmp_ps_mask(a0, largest, _CMP_NLE_UQ) |
                        _mm512_cmp_ps_mask(a1, largest, _CMP_NLE_UQ)) == 0;
    top = _mm512_max_ps(top, _mm512_max_ps(a0, a1));
  }
  const float largest_value = _mm512_reduce_max_ps(top);
  // As prepare_int_x: under 1e-34, 127 / top could overflow, and such a group counts as 0.
  const bool usable = finite && largest_value >= 1e-34f;
  Int8Block out;
  out.step = !finite ? std::numeric_limits<float>::quiet_NaN()
             : usable ? largest_value / 127.0f
                      : 0.0f;
  const __m512 inverse = _mm512_set1_ps(usable ? 127.0f / largest_value : 0.0f);
  for (int i = 0; i < 2; ++i) {
    out.even[i] = _mm512_cvtps_epi32(_mm512_mul_ps(even[i], inverse));
    out.odd[i] = _mm512_cvtps_epi32(_mm512_mul_ps(odd[i], inverse));
  }
  return out;
}
