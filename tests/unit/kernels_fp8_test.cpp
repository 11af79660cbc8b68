// The FP8 codecs against the formats' definitions: every one of the 256 codes of each format
// decoded from its bit fields by an independent formula, encode(decode(c)) == c for every
// non-NaN code, and encode of values between codes against a brute-force nearest search with
// ties to the even code; saturation, NaN, signed zero, the scaled vector forms and abs_max. The
// bulk encoder against fp8_encode on every fp32 exponent; per-tensor and tile scales; tiles at
// ragged edges against a per-element reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <algorithm>
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

// fp8_quantize's bulk encoder is fp8_encode's definition, on values of every fp32 exponent with
// random mantissas, the ties of both formats, subnormals of fp32 and of the formats, infinities
// and NaN.
TEST(Fp8, BulkEncoderIsTheDefinition) {
  std::mt19937 rng(5);
  std::vector<float> x;
  for (int e = -149; e <= 127; ++e)
    for (int i = 0; i < 40; ++i) {
      const float m = 1.0f + float(rng() % (1u << 23)) / float(1u << 23);
      const float v = std::ldexp(m, e);
      x.push_back(v);
      x.push_back(-v);
    }
  for (const Format& F : kFormats)
    for (int c = 0; c < 0x7e; ++c) {
      const float a = fp8_decode(uint8_t(c), F.f), b = fp8_decode(uint8_t(c + 1), F.f);
      if (std::isfinite(a) && std::isfinite(b)) x.push_back(a + (b - a) / 2);
    }
  for (float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::nanf(""),
                  std::numeric_limits<float>::denorm_min()})
    x.push_back(v);
  std::vector<uint8_t> q(x.size());
  for (const Format& F : kFormats) {
    fp8_quantize(q.data(), x.data(), int64_t(x.size()), 1.0f, F.f);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint8_t want = fp8_encode(x[i], F.f);
      if (std::isnan(x[i]))
        EXPECT_TRUE(std::isnan(fp8_decode(q[i], F.f)));
      else
        ASSERT_EQ(int(q[i]), int(want)) << "x = " << x[i];
    }
  }
}

TEST(Fp8, PerTensorAndTileScales) {
  EXPECT_EQ(fp8_scale(2.0f, Fp8Format::e4m3, 0, 7.0f), 224.0f);
  EXPECT_EQ(fp8_scale(2.0f, Fp8Format::e4m3, 2, 7.0f), 56.0f);  // margin: 2^-2
  EXPECT_EQ(fp8_scale(0.0f, Fp8Format::e5m2, 0, 7.0f), 7.0f);   // keeps the previous
  EXPECT_EQ(fp8_scale(INFINITY, Fp8Format::e5m2, 0, 7.0f), 7.0f);
  for (const Format& F : kFormats) {
    EXPECT_EQ(fp8_tile_scale(0.0f, F.f), 1.0f);
    std::mt19937 rng(9);
    std::uniform_real_distribution<double> exponent(-60, 60);
    for (int i = 0; i < 2000; ++i) {
      const float amax = float(std::exp2(exponent(rng)));
      const float s = fp8_tile_scale(amax, F.f);
      int e;
      EXPECT_EQ(std::frexp(s, &e), 0.5f) << "a power of two";
      EXPECT_LE(double(amax) * s, F.max) << amax;
      EXPECT_GT(double(amax) * s * 2, F.max) << "the largest such power, for " << amax;
    }
    EXPECT_EQ(fp8_tile_scale(float(F.max), F.f), 1.0f);
    EXPECT_EQ(fp8_tile_scale(1e-38f, F.f), std::ldexp(1.0f, 127));  // E8M0's range
  }
}

// Each tile quantised with its own power-of-two scale, against a per-element reference that
// finds the element's tile by division; the images (bf16 and fp32) are the exact dequantised
// values. Shapes leave ragged tiles on both edges, and tiles of one row or one column.
TEST(Fp8, TilesAtRaggedEdges) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Case { int64_t rows, cols, tr, tc; };
  for (const Case& k : {Case{5, 300, 1, 128}, Case{300, 7, 128, 1}, Case{200, 130, 128, 128},
                        Case{3, 70, 1, 32}, Case{70, 3, 32, 1}, Case{9, 11, 9, 11}}) {
    const Fp8Tiles t{k.rows, k.cols, k.tr, k.tc};
    std::vector<float> x(size_t(k.rows * k.cols));
    // Tiles of very different magnitudes, so a wrong tile index shows.
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t c = 0; c < k.cols; ++c)
        x[size_t(r * k.cols + c)] = normal(rng) * std::ldexp(1.0f, int((r / k.tr + 3 * (c / k.tc)) % 17) - 8);
    for (const Format& F : kFormats) {
      std::vector<uint8_t> q(x.size());
      std::vector<float> factors(size_t(t.count())), image32(x.size());
      std::vector<bf16> image16(x.size());
      fp8_quantize_tiles(q.data(), factors.data(), x.data(), t, F.f);
      fp8_image(image16.data(), q.data(), factors.data(), t, F.f);
      fp8_image(image32.data(), q.data(), factors.data(), t, F.f);
      std::vector<float> amax(size_t(t.count()), 0.0f);
      auto tile = [&](int64_t r, int64_t c) { return size_t((r / k.tr) * t.tiles_across() + c / k.tc); };
      for (int64_t r = 0; r < k.rows; ++r)
        for (int64_t c = 0; c < k.cols; ++c)
          amax[tile(r, c)] = std::max(amax[tile(r, c)], std::fabs(x[size_t(r * k.cols + c)]));
      for (int64_t r = 0; r < k.rows; ++r)
        for (int64_t c = 0; c < k.cols; ++c) {
          const size_t i = size_t(r * k.cols + c);
          const float scale = fp8_tile_scale(amax[tile(r, c)], F.f);
          ASSERT_EQ(factors[tile(r, c)], 1.0f / scale);
          ASSERT_EQ(q[i], fp8_encode(x[i] * scale, F.f)) << r << "," << c;
          const float v = fp8_decode(q[i], F.f) / scale;
          ASSERT_EQ(image32[i], v);
          ASSERT_EQ(from_bf16(image16[i]), v);
          EXPECT_NEAR(v, x[i], amax[tile(r, c)] / (F.f == Fp8Format::e4m3 ? 8 : 4)) << r << "," << c;
        }
    }
  }
}

}  // namespace
}  // namespace cleave::kernels
