// Branch-free float16/bfloat16 <-> float32 conversions (internal to the kernels).
// They are written with integer bit manipulation and selects only, so that loops calling them
// auto-vectorise. They require IEEE float32 arithmetic in round-to-nearest-even mode and must not
// be compiled with -ffast-math or FMA contraction (the kernels library builds with
// -ffp-contract=off).
#pragma once

#include <bit>
#include <cstdint>

namespace railyard::kernels::internal {

// float16 -> float32, exact. Signalling NaNs come out quiet (the NaN path goes through a float
// multiply). After Maratyszcza's FP16 library (fp16_ieee_to_fp32_value).
[[gnu::always_inline]] inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out
  // Normal, inf, NaN: move the exponent/mantissa into place and rebias by multiplying by 2^-112.
  constexpr uint32_t kExpOffset = 0xE0u << 23;
  constexpr float kExpScale = 0x1.0p-112f;
  const float normalized = std::bit_cast<float>((two_w >> 4) + kExpOffset) * kExpScale;
  // Subnormal (value m * 2^-24): build the float 0.5 + m * 2^-24 exactly and subtract 0.5.
  constexpr uint32_t kMagicMask = 126u << 23;
  constexpr float kMagicBias = 0.5f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | kMagicMask) - kMagicBias;
  constexpr uint32_t kDenormalizedCutoff = 1u << 27;
  // Select with a mask rather than ?: so that both float ops stay unconditional: GCC will not
  // if-convert (vectorise) a branch around a possibly-trapping float op under -ftrapping-math.
  const uint32_t is_denormal = 0u - static_cast<uint32_t>(two_w < kDenormalizedCutoff);
  const uint32_t bits = sign | (std::bit_cast<uint32_t>(denormalized) & is_denormal) |
                        (std::bit_cast<uint32_t>(normalized) & ~is_denormal);
  return std::bit_cast<float>(bits);
}

// float32 -> float16, round-to-nearest-even, overflow to +-inf, subnormals exact, NaN -> quiet NaN
// (0x7E00 with the sign). After Maratyszcza's FP16 library (fp16_ieee_from_fp32_value): the
// float adds below do the rounding in hardware.
[[gnu::always_inline]] inline uint16_t FloatToHalfBits(float f) {
  constexpr float kScaleToInf = 0x1.0p+112f;
  constexpr float kScaleToZero = 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const float abs_f = std::bit_cast<float>(w & 0x7FFFFFFFu);
  float base = (abs_f * kScaleToInf) * kScaleToZero;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  const uint32_t is_nan = 0u - static_cast<uint32_t>(shl1_w > 0xFF000000u);  // mask, see above
  return static_cast<uint16_t>((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

// bfloat16 -> float32, exact, NaN payloads (signalling or not) passed through unchanged. The
// reduction loops use this one: a NaN is quieted anyway by the arithmetic or by
// FloatToBFloat16Bits when the result is stored.
[[gnu::always_inline]] inline float BFloat16BitsToFloatRaw(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// bfloat16 -> float32, exact; a signalling NaN comes out quiet.
[[gnu::always_inline]] inline float BFloat16BitsToFloat(uint16_t b) {
  const uint32_t is_nan = (b & 0x7FFFu) > 0x7F80u ? 0x00400000u : 0u;
  return std::bit_cast<float>((static_cast<uint32_t>(b) << 16) | is_nan);
}

// float32 -> bfloat16, round-to-nearest-even (overflow carries into the exponent and gives inf),
// NaN -> quiet NaN with the sign and the top payload bits kept.
[[gnu::always_inline]] inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t lsb = (u >> 16) & 1u;
  const uint32_t rounded = (u + 0x7FFFu + lsb) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

}  // namespace railyard::kernels::internal
