// fp32 <-> bf16: round to nearest even (ties, overflow to inf), NaN stays NaN, exact widening,
// and every bf16 value round-trips; every fp16 value widens exactly.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/base/bf16_round.h"
#include "cleave/kernels/convert.h"

namespace k = cleave::kernels;

namespace {

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

k::bf16 narrow(float f) {
  k::bf16 b;
  k::f32_to_bf16(&b, &f, 1);
  return b;
}

float widen(k::bf16 b) {
  float f;
  k::bf16_to_f32(&f, &b, 1);
  return f;
}

// Reference: the nearer of the two bf16 neighbours (by exact double distance), ties to even.
// f must not be NaN or inf.
k::bf16 ref_narrow(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t lo = u >> 16, hi = lo + 1;
  const double dlo = std::fabs(double(f) - double(from_bits(lo << 16)));
  // Past the largest finite bf16 the upper neighbour is inf; for rounding it counts as 2^128.
  double vhi = from_bits(hi << 16);
  if (std::isinf(vhi)) vhi = std::copysign(std::ldexp(1.0, 128), vhi);
  const double dhi = std::fabs(vhi - double(f));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST(Convert, RoundsToNearestEven) {
  EXPECT_EQ(narrow(1.0f), 0x3F80);
  EXPECT_EQ(narrow(from_bits(0x3F808000)), 0x3F80);  // tie, even below
  EXPECT_EQ(narrow(from_bits(0x3F818000)), 0x3F82);  // tie, even above
  EXPECT_EQ(narrow(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(narrow(from_bits(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(narrow(-0.0f), 0x8000);
  EXPECT_EQ(narrow(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(narrow(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(narrow(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(narrow(from_bits(0x00008000)), 0x0000);               // subnormal tie to even
  EXPECT_EQ(narrow(from_bits(0x00018000)), 0x0002);
}

TEST(Convert, NaNStaysNaN) {
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0xFF800001u, 0x7FFFFFFFu}) {
    const k::bf16 b = narrow(from_bits(u));
    EXPECT_TRUE(std::isnan(widen(b))) << std::hex << u << " -> " << b;
    EXPECT_EQ(b & 0x8000, (u >> 16) & 0x8000) << "sign kept";
  }
}

TEST(Convert, MatchesReferenceOnRandomBits) {
  const size_t n = 200003;  // several blocks
  std::mt19937 gen(1);
  std::vector<float> in(n);
  for (auto& f : in) {
    do f = from_bits(gen());
    while (!std::isfinite(f));
  in[0] = from_bits(0x7F7F8000);  // the overflow tie: rounds to inf
  in[1] = from_bits(0xFF7F7FFF);  // just below it: stays finite
  }
  std::vector<k::bf16> out(n);
  k::f32_to_bf16(out.data(), in.data(), n);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], ref_narrow(in[i])) << std::hex << in[i];
  EXPECT_EQ(out[0], 0x7F80);
  EXPECT_EQ(out[1], 0xFF7F);
}

// The vector lanes give to_bf16's bits for every class of input, alone in a vector or mixed with
// others: the rounding instruction of AVX-512 BF16 reads a subnormal as zero, so a vector holding
// one (among NaNs, infinities and ties) takes the integer path for it.
TEST(Convert, VectorLanesMatchTheScalarRoundingOnSpecialValues) {
  const std::vector<uint32_t> special = {
      0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, 0x807F8000u,  // subnormal
      0x7FC00000u, 0x7F800001u, 0xFF80FFFFu, 0x7FFFFFFFu,                            // NaN
      0x7F800000u, 0xFF800000u, 0x7F7F8000u, 0x7F7FFFFFu,                // inf, overflow tie
      0x3F808000u, 0x3F818000u, 0x00800000u, 0x80000000u, 0x00000000u};  // ties, normal, zeros
  std::mt19937 gen(3);
  for (int mix = 0; mix < 3; ++mix) {  // all special; one in every 16; specials among normals
    std::vector<float> in(16 * 64 + 7);
    for (size_t i = 0; i < in.size(); ++i) {
      const bool pick = mix == 0 || (mix == 1 ? i % 16 == (i / 16) % 16 : gen() % 4 == 0);
      in[i] = pick ? from_bits(special[gen() % special.size()])
                   : std::normal_distribution<float>()(gen);
    }
    std::vector<k::bf16> out(in.size());
    k::f32_to_bf16(out.data(), in.data(), int64_t(in.size()));
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], cleave::to_bf16(in[i]))
          << "mix " << mix << " at " << i << ": " << std::hex << std::bit_cast<uint32_t>(in[i]);
  }
}

#ifdef __AVX512F__
// The integer path alone (all of it on a CPU without AVX-512 BF16): every class of input, and
// random bits, against to_bf16.
TEST(Convert, IntegerLanesMatchTheScalarRounding) {
  const uint32_t special[16] = {0x00000001u, 0x807F8000u, 0x7FC00000u, 0x7F800001u,
                                0xFF80FFFFu, 0x7FFFFFFFu, 0x7F800000u, 0xFF800000u,
                                0x7F7F8000u, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u,
                                0x00800000u, 0x80000000u, 0x00000000u, 0x3F807FFFu};
  std::mt19937 gen(4);
  for (int round = 0; round < 4096; ++round) {
    alignas(64) float in[16];
    for (int l = 0; l < 16; ++l) in[l] = from_bits(round == 0 ? special[l] : gen());
    alignas(32) k::bf16 out[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), cleave::bf16_round_int(_mm512_load_ps(in)));
    for (int l = 0; l < 16; ++l)
      ASSERT_EQ(out[l], cleave::to_bf16(in[l])) << std::hex << std::bit_cast<uint32_t>(in[l]);
  }
}
#endif

TEST(Convert, EveryBf16RoundTrips) {
  std::vector<k::bf16> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i] = static_cast<k::bf16>(i);
  std::vector<float> f(65536);
  k::bf16_to_f32(f.data(), all.data(), 65536);
  k::f32_to_bf16(back.data(), f.data(), 65536);
  for (uint32_t i = 0; i < 65536; i++) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), i << 16);
    if (std::isnan(f[i]))
      ASSERT_TRUE(std::isnan(widen(back[i])));
    else
      ASSERT_EQ(back[i], all[i]) << i;
  }
}

// Every fp16 bit pattern against the format's definition: (-1)^s 2^(e-15) (1 + m/1024) for a
// normal, 2^-14 (m/1024) for a subnormal, inf and NaN at e = 31.
TEST(Convert, EveryFp16Widens) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; i++) all[i] = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  k::f16_to_f32(f.data(), all.data(), 65536);
  for (uint32_t i = 0; i < 65536; i++) {
    const int s = int(i >> 15), e = int((i >> 10) & 31), m = int(i & 1023);
    if (e == 31) {
      ASSERT_TRUE(m == 0 ? std::isinf(f[i]) && std::signbit(f[i]) == bool(s) : std::isnan(f[i])) << i;
      continue;
    }
    const double magnitude = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1024.0 + m, e - 25);
    ASSERT_EQ(double(f[i]), s ? -magnitude : magnitude) << i;
    ASSERT_EQ(std::signbit(f[i]), bool(s)) << i;
  }
}

TEST(Convert, IndependentOfThreadCountAndRejectsNegativeSize) {
  const size_t n = (1 << 14) * 3 + 5;
  std::mt19937 gen(2);
  std::vector<float> in(n);
  for (auto& f : in) f = std::normal_distribution<float>()(gen);
  std::vector<k::bf16> a(n), b(n);
  omp_set_num_threads(1);
  k::f32_to_bf16(a.data(), in.data(), n);
  omp_set_num_threads(3);
  k::f32_to_bf16(b.data(), in.data(), n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(k::bf16)), 0);
  float f;
  k::bf16 h = 0;
  EXPECT_THROW(k::f32_to_bf16(&h, &f, -1), cleave::Error);
  EXPECT_THROW(k::bf16_to_f32(&f, &h, -1), cleave::Error);
}

// round_to_fp16 against an independent reference: the nearer of the two fp16 grid neighbours of
// |f| (spacing 2^(e-10) for normals, 2^-24 below 2^-14), ties to the even mantissa, inf past the
// midpoint between 65504 and 2^16. The vector lanes and the scalar tail must agree with it.
namespace {

double ref_fp16(float f) {
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return std::copysign(INFINITY, f);  // 65504 + half a step
  int e = 0;
  std::frexp(a, &e);                                     // a = m 2^e, m in [0.5, 1)
  const double step = std::ldexp(1.0, std::max(e - 11, -24));
  const double q = a / step, lo = std::floor(q);
  double k = q - lo > 0.5 ? lo + 1 : q - lo < 0.5 ? lo : (std::fmod(lo, 2.0) == 0 ? lo : lo + 1);
  return std::copysign(k * step, f);
}

}  // namespace

TEST(Convert, RoundsToFp16) {
  std::vector<float> in = {1.0f, 65504.0f, 65519.0f, 65520.0f, -70000.0f, 1.00048828125f,
                           1.00146484375f, 5.9604645e-8f, 2.98023224e-8f, 2.99e-8f, 1e-8f,
                           6.1035156e-5f, 3.0517578e-5f, -0.0f};
  std::mt19937 gen(2);
  for (int i = 0; i < 100000; ++i) {
    float f;
    do f = std::ldexp(float(gen() % (1u << 24)) / float(1u << 24) + 0.5f, int(gen() % 50) - 30);
    while (!std::isfinite(f));
    in.push_back(gen() % 2 ? f : -f);
  }
  std::vector<float> out(in.size());
  k::round_to_fp16(out.data(), in.data(), int64_t(in.size()));
  for (size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(double(out[i]), ref_fp16(in[i])) << "at " << i << ": " << in[i];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float back;
  k::round_to_fp16(&back, &nan, 1);
  EXPECT_TRUE(std::isnan(back));
}
