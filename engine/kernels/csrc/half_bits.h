// Exact conversions between fp32 and the 16-bit formats, bit by bit (round to nearest even, as
// MLX's own casts do; NaN stays NaN).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace exo_kernels {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float bf16_to_float(uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: normalise.
    exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    return bits_float(sign | (exponent << 23) | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (magnitude < 0x38800000u) {  // a subnormal half (or zero)
    // Add as a float of the half's smallest subnormal scale: the FPU rounds to nearest even.
    const float scaled = bits_float(magnitude) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(scaled) - 0x3f000000u));
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude + 0xfffu + odd - (112u << 23);
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

// An E8M0 scale (MXFP4's): 2^(e - 127); 255, which the format reserves for NaN, overflows to
// infinity as MLX computes it.
inline float e8m0_to_float(uint8_t e) {
  return bits_float(e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23);
}

// The 16 values of an E2M1 code (MXFP4's weights): sign, 2 exponent bits, 1 mantissa bit.
inline float e2m1_to_float(int q) {
  constexpr float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return q & 8 ? -magnitudes[q & 7] : magnitudes[q & 7];
}

}  // namespace exo_kernels
