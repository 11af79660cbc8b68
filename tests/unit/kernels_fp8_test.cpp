// The FP8 codecs against the formats' definitions: every one of the 256 codes of each format
// decoded from its bit fields by an independent formula, encode(decode(c)) == c for every
// non-NaN code, and encode of values between codes against a brute-force nearest search with
// ties to the even code; saturation, NaN, signed zero, the scaled vector forms and abs_max.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cleave/kernels/fp8.h"

namespace cleave::kernels {
namespace {

// The value of a code by the format's definition, in double.
double defined_value(int code, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int e = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int m = code & ((1 << mantissa_bits) - 1);
  const double sign = code & 0x80 ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(double(m) / (1 << mantissa_bits), 1 - bias);
  return sign * std::ldexp(1.0 + double(m) / (1 << mantissa_bits), e - bias);
}

bool is_nan_code(int code, Fp8Format f) {
  const int bits = code & 0x7f;
  return f == Fp8Format::e4m3 ? bits == 0x7f : (bits >> 2) == 31 && (bits & 3) != 0;
}
bool is_inf_code(int code, Fp8Format f) { return f == Fp8Format::e5m2 && (code & 0x7f) == 0x7c; }

struct Format {
  Fp8Format f;
  int exponent_bits, mantissa_bits;
  double max;
};
const Format kFormats[] = {{Fp8Format::e4m3, 4, 3, 448.0}, {Fp8Format::e5m2, 5, 2, 57344.0}};

TEST(Fp8, EveryCodeDecodesToItsDefinitionAndEncodesBack) {
  for (const Format& F : kFormats) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_decode(uint8_t(c), F.f);
      if (is_nan_code(c, F.f)) {
        EXPECT_TRUE(std::isnan(v)) << c;
        continue;
      }
      if (is_inf_code(c, F.f)) {
        EXPECT_TRUE(std::isinf(v)) << c;
        continue;
      }
      ++finite;
      EXPECT_EQ(double(v), defined_value(c, F.exponent_bits, F.mantissa_bits)) << c;
      EXPECT_EQ(fp8_encode(v, F.f), uint8_t(c)) << "code " << c << " value " << v;
    }
    EXPECT_EQ(finite, F.f == Fp8Format::e4m3 ? 254 : 248);
    EXPECT_EQ(fp8_max(F.f), F.max);
    EXPECT_EQ(fp8_decode(fp8_encode(float(F.max), F.f), F.f), F.max);
  }
}

// The nearest finite code by brute force, ties to the code with an even mantissa (the last bit).
int nearest(double x, Fp8Format f) {
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c, f) || is_inf_code(c, f)) continue;
    if ((c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;  // the sign is kept, zero's too
    const double d = std::fabs(double(fp8_decode(uint8_t(c), f)) - x);
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return best;
}

TEST(Fp8, EncodeRoundsToNearestEvenAndSaturates) {
  std::mt19937 rng(3);
  for (const Format& F : kFormats) {
    std::vector<double> values;
    // Midpoints between neighbouring codes (the ties), a quarter either side of them, and
    // random values over the whole range, subnormals included.
    for (int c = 0; c < 0x7f; ++c) {
      if (is_nan_code(c + 1, F.f) || is_inf_code(c + 1, F.f)) break;
      const double a = fp8_decode(uint8_t(c), F.f), b = fp8_decode(uint8_t(c + 1), F.f);
      for (double t : {0.5, 0.25, 0.75}) values.push_back(a + t * (b - a));
    }
    std::uniform_real_distribution<double> exponent(-20, std::log2(F.max));
    for (int i = 0; i < 4000; ++i) values.push_back(std::exp2(exponent(rng)));
    for (double v : values)
      for (double x : {v, -v}) {
        const float xf = float(x);
        EXPECT_EQ(int(fp8_encode(xf, F.f)), nearest(double(xf), F.f)) << "x = " << xf;
      }
    // Beyond the largest value, infinities included: the largest, with the sign.
    for (float big : {float(F.max) * 1.01f, float(F.max) * 4.0f, 1e30f,
                      std::numeric_limits<float>::infinity()}) {
      EXPECT_EQ(fp8_decode(fp8_encode(big, F.f), F.f), float(F.max));
      EXPECT_EQ(fp8_decode(fp8_encode(-big, F.f), F.f), -float(F.max));
    }
    EXPECT_TRUE(std::isnan(fp8_decode(fp8_encode(std::nanf(""), F.f), F.f)));
    EXPECT_EQ(fp8_encode(-0.0f, F.f), 0x80);
    EXPECT_EQ(fp8_encode(1e-30f, F.f), 0x00);  // far below the smallest subnormal
  }
}

TEST(Fp8, ScaledVectorsAndAbsMax) {
  std::vector<float> x = {0.5f, -3.0f, 1e-3f, 100.0f, -0.0f, 7.25f};
  std::vector<uint8_t> q(x.size());
  std::vector<float> back(x.size());
  const float scale = 448.0f / abs_max(x.data(), int64_t(x.size()));
  fp8_quantize(q.data(), x.data(), int64_t(x.size()), scale, Fp8Format::e4m3);
  fp8_dequantize(back.data(), q.data(), int64_t(x.size()), 1.0f / scale, Fp8Format::e4m3);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(q[i], fp8_encode(x[i] * scale, Fp8Format::e4m3));
    EXPECT_EQ(back[i], fp8_decode(q[i], Fp8Format::e4m3) * (1.0f / scale));
    EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) / 16 + 1e-2f) << i;  // 3 mantissa bits
  }
  EXPECT_EQ(back[3], 100.0f);  // the largest maps to 448 and back exactly
  std::vector<float> with_nan = {1.0f, std::nanf(""), -5.0f};
  EXPECT_EQ(abs_max(with_nan.data(), 3), 5.0f);
}

}  // namespace
}  // namespace cleave::kernels
