#include "cleave/kernels/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cleave::kernels {

namespace {

struct Layout {
  int mantissa_bits, bias;
  int min_exponent;  // of the smallest normal: 1 - bias
  float max;
  uint8_t max_code, nan_code;  // without the sign bit
};

Layout layout_of(Fp8Format f) {
  if (f == Fp8Format::e4m3) return {3, 7, -6, 448.0f, 0x7e, 0x7f};
  return {2, 15, -14, 57344.0f, 0x7b, 0x7f};
}

}  // namespace

float fp8_max(Fp8Format f) { return layout_of(f).max; }

uint8_t fp8_encode(float x, Fp8Format f) {
  const Layout L = layout_of(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return uint8_t(sign | L.nan_code);
  const float a = std::fabs(x);
  if (a >= L.max) return uint8_t(sign | L.max_code);
  // The spacing of representable values around a: 2^(e - mantissa bits) in the binade of a, the
  // subnormals' below the smallest normal. a / spacing and the product back are exact, and
  // nearbyint rounds half to even in the default rounding mode.
  const int e = a == 0 ? L.min_exponent : std::max(std::ilogb(a), L.min_exponent);
  const float spacing = std::ldexp(1.0f, e - L.mantissa_bits);
  const float q = std::nearbyint(a / spacing) * spacing;
  if (q == 0) return sign;
  if (q >= L.max) return uint8_t(sign | L.max_code);
  const int qe = std::ilogb(q);
  if (qe < L.min_exponent)  // subnormal: exponent field 0
    return uint8_t(sign | uint8_t(q / std::ldexp(1.0f, L.min_exponent - L.mantissa_bits)));
  const int mantissa = int(std::ldexp(q, L.mantissa_bits - qe)) - (1 << L.mantissa_bits);
  return uint8_t(sign | uint8_t((qe + L.bias) << L.mantissa_bits) | uint8_t(mantissa));
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Layout L = layout_of(f);
  const bool negative = code & 0x80;
  const int bits = code & 0x7f;
  const int exponent = bits >> L.mantissa_bits, mantissa = bits & ((1 << L.mantissa_bits) - 1);
  float v;
  if (f == Fp8Format::e4m3 && bits == 0x7f) {
    v = std::nanf("");
  } else if (f == Fp8Format::e5m2 && exponent == 31) {
    v = mantissa == 0 ? INFINITY : std::nanf("");
  } else if (exponent == 0) {
    v = std::ldexp(float(mantissa), L.min_exponent - L.mantissa_bits);
  } else {
    v = std::ldexp(float(mantissa + (1 << L.mantissa_bits)), exponent - L.bias - L.mantissa_bits);
  }
  return negative ? -v : v;
}

void fp8_quantize(uint8_t* dst, const float* src, int64_t n, float scale, Fp8Format f) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = fp8_encode(src[i] * scale, f);
}

void fp8_dequantize(float* dst, const uint8_t* src, int64_t n, float inv_scale, Fp8Format f) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8_decode(uint8_t(c), f) * inv_scale;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
}

float abs_max(const float* src, int64_t n) {
  float m = 0;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(src[i]));
  return m;
}

}  // namespace cleave::kernels
