// bf16 as the upper half of an fp32, one element at a time; every bulk conversion builds on these.
#pragma once
#include <bit>
#include <cstdint>

namespace cleave {

using bf16 = uint16_t;

// Narrowing rounds to nearest, ties to even, by adding 0x7FFF plus the lowest kept bit before
// truncating (overflow correctly rounds to inf). NaN is kept a quiet NaN (the add could otherwise
// carry a NaN's payload into inf). Branch-free: it vectorises.
inline bf16 to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<bf16>(is_nan ? quiet_nan : rounded);
}

inline float from_bf16(bf16 h) { return std::bit_cast<float>(uint32_t(h) << 16); }

}  // namespace cleave
