// Internal to the kernels: a branch-free float exp that g++ can vectorise. glibc's expf/tanhf only
// get SIMD variants under -ffast-math, which we do not use (it would break reproducible numerics),
// so a loop calling std::exp stays scalar. exp_f is accurate to about 2 ulp on its range.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace cleave::kernels::vmath {

// exp(x). x < ln(FLT_MIN) returns 0 (so exp(-inf) = 0); x > 88 saturates at exp(88) ~ 1.65e38,
// finite on purpose so that e / (1 + e) and e * 0 never make NaN; NaN in gives NaN out.
inline float exp_f(float x) {
  constexpr float kLo = -87.33654f;  // ln(FLT_MIN): below it the result would be subnormal
  constexpr float kHi = 88.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;      // ln 2 split so that n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;   // ln 2 - kLn2Hi
  constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
  // x = n ln2 + r with |r| <= ln2 / 2; n is read from the bits of k, which avoids a float->int
  // conversion (undefined for NaN) and keeps the loop integer-op free apart from one shift.
  // Every mul-add is a written-out fma, so that the result does not hang on whether the compiler
  // contracts (attention's forward is compiled without contraction, the other kernels with).
  const float k = std::fma(xc, kLog2e, kRound);
  const float n = k - kRound;
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, xc));
  // Taylor to degree 7: the truncation error r^8/8! < 6e-9 on |r| <= 0.347.
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  // 2^n: the low bits of k hold n + 0x400000; shifted by 23 the 0x4B400000 offset falls off.
  const float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(k) + 127u) << 23);
  return x < kLo ? 0.0f : p * scale;
}

}  // namespace cleave::kernels::vmath
