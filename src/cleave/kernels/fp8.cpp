#include "cleave/kernels/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

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

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
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
  // Branch-free, so that the bulk loops vectorise: both roundings are made and one is chosen.
  uint8_t operator()(float x) const {
    uint32_t u = bits_of(x);
    const uint32_t sign = (u >> 24) & 0x80;
    u &= 0x7fffffffu;
    const uint32_t rounded = (u + (1u << (shift - 1)) - 1 + ((u >> shift) & 1)) >> shift;
    const uint32_t normal = rounded > max_rounded ? max_code : rounded - rebias;
    // The subnormals' count, rounded half to even by fp32's own addition at 2^23 (exact below
    // 2^23; at most 2^mantissa_bits, where rounding up gives the smallest normal's code).
    float a;
    std::memcpy(&a, &u, sizeof a);
    const float steps = (a * subnormal_steps + 8388608.0f) - 8388608.0f;
    const uint32_t subnormal = uint32_t(steps);
    const uint32_t code = u > 0x7f800000u ? nan_code : u < min_normal_bits ? subnormal : normal;
    return uint8_t(sign | code);
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
  // A comparison, not fmax (a libm call): it vectorises, and a NaN compares false and is skipped.
#pragma omp parallel for simd schedule(static) reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(src[i]);
    m = a > m ? a : m;
  }
  return m;
}

float fp8_scale(float amax, Fp8Format f, int margin, float previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const float scale = fp8_max(f) / amax / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : previous;
}

float fp8_tile_scale(float amax, Fp8Format f) {
  if (!(amax > 0)) return 1.0f;
  if (!std::isfinite(amax)) return from_bits(0x00400000u);  // 2^-127
  // On the bits, without libm (a tile recipe takes a scale per 32 or 128 values): with
  // amax = (1 + a) 2^ea and max = (1 + m) 2^em, the largest e with amax 2^e <= max is em - ea,
  // less one when a > m. A subnormal amax puts e above E8M0's range.
  const uint32_t a = bits_of(amax), m = bits_of(fp8_max(f));
  if (a < 0x00800000u) return from_bits(0x7f000000u);  // 2^127
  const int e = std::clamp(int(m >> 23) - int(a >> 23) - int((a & 0x7fffffu) > (m & 0x7fffffu)),
                           -127, 127);
  return from_bits(e >= -126 ? uint32_t(e + 127) << 23 : 0x00400000u);
}

namespace {

// Tiles are visited a band of tile_rows rows at a time, the bands spread over threads: each band
// works on whole rows (contiguous, so the loops vectorise) with its tiles' values spread to one
// per column. A single per-tensor tile spreads its rows over threads instead.
template <typename Band>
void for_each_band(const Fp8Tiles& t, Band band) {
  const int64_t bands = t.tiles_down();
#pragma omp parallel
  {
    std::vector<float> per_column(size_t(t.cols));
    if (bands == 1 && t.tiles_across() == 1) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < t.rows; ++r) band(0, r, r + 1, per_column.data(), true);
    } else {
#pragma omp for schedule(static)
      for (int64_t b = 0; b < bands; ++b)
        band(b, b * t.tile_rows, std::min(t.rows, (b + 1) * t.tile_rows), per_column.data(), false);
    }
  }
}

// The band's tiles' values, one per column.
void spread(float* per_column, const float* per_tile, const Fp8Tiles& t) {
  for (int64_t j = 0; j < t.tiles_across(); ++j)
    std::fill(per_column + j * t.tile_cols, per_column + std::min(t.cols, (j + 1) * t.tile_cols),
              per_tile[j]);
}

template <typename T>
void image(T* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t, Fp8Format f) {
  float codes[256];
  for (int c = 0; c < 256; ++c) codes[c] = fp8_decode(uint8_t(c), f);
  const int64_t across = t.tiles_across();
  for_each_band(t, [&](int64_t b, int64_t r0, int64_t r1, float* factor, bool single) {
    if (single)
      std::fill(factor, factor + t.cols, factors[0]);
    else
      spread(factor, factors + b * across, t);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* q = src + r * t.cols;
      T* out = dst + r * t.cols;
#pragma omp simd
      for (int64_t c = 0; c < t.cols; ++c) {
        const float v = codes[q[c]] * factor[c];
        if constexpr (std::is_same_v<T, bf16>) {
          out[c] = bf16(bits_of(v) >> 16);  // exact: v has at most 4 significant bits
        } else {
          out[c] = v;
        }
      }
    }
  });
}

}  // namespace

void fp8_quantize_tiles(uint8_t* dst, float* factors, const float* src, const Fp8Tiles& t,
                        Fp8Format f) {
  const FastEncoder encode(f);
  const int64_t across = t.tiles_across();
  // A single tile needs the whole tensor's amax before any row is encoded.
  if (t.count() == 1) {
    const float scale = fp8_tile_scale(abs_max(src, t.rows * t.cols), f);
    factors[0] = 1.0f / scale;
    fp8_quantize(dst, src, t.rows * t.cols, scale, f);
    return;
  }
  for_each_band(t, [&](int64_t b, int64_t r0, int64_t r1, float* column, bool) {
    // The band's largest magnitude per column, then per tile, then each tile's scale.
    std::fill(column, column + t.cols, 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = src + r * t.cols;
      for (int64_t c = 0; c < t.cols; ++c) {
        const float a = std::fabs(x[c]);
        column[c] = a > column[c] ? a : column[c];
      }
    }
    float* band_factors = factors + b * across;
    for (int64_t j = 0; j < across; ++j) {
      float amax = 0;
      for (int64_t c = j * t.tile_cols; c < std::min(t.cols, (j + 1) * t.tile_cols); ++c)
        amax = column[c] > amax ? column[c] : amax;
      band_factors[j] = fp8_tile_scale(amax, f);  // the scale, for now
    }
    spread(column, band_factors, t);
    for (int64_t j = 0; j < across; ++j) band_factors[j] = 1.0f / band_factors[j];
    // A local encoder and `simd`: a uint8_t store may alias anything, so without them the loop
    // stays scalar and reloads the encoder's fields for every value.
    const FastEncoder e = encode;
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = src + r * t.cols;
      uint8_t* q = dst + r * t.cols;
#pragma omp simd
      for (int64_t c = 0; c < t.cols; ++c) q[c] = e(x[c] * column[c]);
    }
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
