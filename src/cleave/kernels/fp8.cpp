#include "cleave/kernels/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

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

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// fp8_encode on fp32's bits, for the bulk conversions (checked against fp8_encode, which follows
// the formats' definitions, in kernels_fp8_test): round half to even at the format's mantissa
// width by an add on the bits, the format's subnormals by rounding a / (smallest subnormal).
struct FastEncoder {
  int shift;                    // fp32 mantissa bits dropped
  uint32_t min_normal_bits;     // fp32 bits of the format's smallest normal
  uint32_t max_rounded;         // fp32 bits of the largest finite value >> shift
  uint32_t rebias;              // (127 - bias) << mantissa_bits
  float subnormal_steps;        // 1 / the smallest subnormal
  uint8_t max_code, nan_code;
  explicit FastEncoder(Fp8Format f) {
    const Layout L = layout_of(f);
    shift = 23 - L.mantissa_bits;
    min_normal_bits = uint32_t(L.min_exponent + 127) << 23;
    max_rounded = bits_of(L.max) >> shift;
    rebias = uint32_t(127 - L.bias) << L.mantissa_bits;
    subnormal_steps = std::ldexp(1.0f, L.mantissa_bits - L.min_exponent);
    max_code = L.max_code;
    nan_code = L.nan_code;
  }
  uint8_t operator()(float x) const {
    uint32_t u = bits_of(x);
    const uint8_t sign = uint8_t((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return uint8_t(sign | nan_code);
    if (u < min_normal_bits) {
      float a;
      std::memcpy(&a, &u, sizeof a);
      // At most 2^mantissa_bits: rounding up to the smallest normal gives its code.
      return uint8_t(sign | uint8_t(std::nearbyint(a * subnormal_steps)));
    }
    u += (1u << (shift - 1)) - 1 + ((u >> shift) & 1);
    const uint32_t rounded = u >> shift;
    if (rounded > max_rounded) return uint8_t(sign | max_code);
    return uint8_t(sign | uint8_t(rounded - rebias));
  }
};

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
  const FastEncoder encode(f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = encode(src[i] * scale);
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

float fp8_scale(float amax, Fp8Format f, int margin, float previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const float scale = fp8_max(f) / amax / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : previous;
}

float fp8_tile_scale(float amax, Fp8Format f) {
  if (!(amax > 0)) return 1.0f;
  if (!std::isfinite(amax)) return std::ldexp(1.0f, -127);
  // The largest power of two 2^e with amax * 2^e <= max: e = floor(log2(max / amax)), computed
  // exactly on the exponents and checked once (the quotient's rounding could push it over).
  int e = std::ilogb(fp8_max(f)) - std::ilogb(amax);
  if (std::ldexp(amax, e) > fp8_max(f)) --e;
  if (std::ldexp(amax, e + 1) <= fp8_max(f)) ++e;
  return std::ldexp(1.0f, std::clamp(e, -127, 127));
}

namespace {

// Calls body(tile index, row0, row1, col0, col1) for every tile, tiles spread over threads.
template <typename Body>
void for_each_tile(const Fp8Tiles& t, Body body) {
  const int64_t across = t.tiles_across(), count = t.count();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < count; ++k) {
    const int64_t r0 = (k / across) * t.tile_rows, c0 = (k % across) * t.tile_cols;
    body(k, r0, std::min(t.rows, r0 + t.tile_rows), c0, std::min(t.cols, c0 + t.tile_cols));
  }
}

// Rows of a single tile (one per-tensor tile) are spread over threads instead.
template <typename Body>
void for_each_row_of_tiles(const Fp8Tiles& t, Body body) {
  if (t.count() > 1) {
    for_each_tile(t, [&](int64_t k, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      for (int64_t r = r0; r < r1; ++r) body(k, r, c0, c1);
    });
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < t.rows; ++r) body(0, r, 0, t.cols);
}

template <typename T>
void image(T* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t, Fp8Format f) {
  float codes[256];
  for (int c = 0; c < 256; ++c) codes[c] = fp8_decode(uint8_t(c), f);
  for_each_row_of_tiles(t, [&](int64_t k, int64_t r, int64_t c0, int64_t c1) {
    const float factor = factors[k];
    const uint8_t* q = src + r * t.cols;
    T* out = dst + r * t.cols;
    for (int64_t c = c0; c < c1; ++c) {
      const float v = codes[q[c]] * factor;
      if constexpr (std::is_same_v<T, bf16>) {
        out[c] = bf16(bits_of(v) >> 16);  // exact: v has at most 4 significant bits
      } else {
        out[c] = v;
      }
    }
  });
}

}  // namespace

void fp8_quantize_tiles(uint8_t* dst, float* factors, const float* src, const Fp8Tiles& t,
                        Fp8Format f) {
  const FastEncoder encode(f);
  for_each_tile(t, [&](int64_t k, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float amax = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(src[r * t.cols + c]));
    const float scale = fp8_tile_scale(amax, f);
    factors[k] = 1.0f / scale;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) dst[r * t.cols + c] = encode(src[r * t.cols + c] * scale);
  });
}

void fp8_image(bf16* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t,
               Fp8Format f) {
  image(dst, src, factors, t, f);
}

void fp8_image(float* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t,
               Fp8Format f) {
  image(dst, src, factors, t, f);
}

}  // namespace cleave::kernels
