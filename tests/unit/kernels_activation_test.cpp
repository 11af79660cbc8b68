// GELU (tanh), SwiGLU and add_inplace against double-precision references and central finite
// differences of sum(dout * out); backward writes (=) dx; bitwise independence from thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/activation.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

// 0.5 x (1 + tanh(u)) written as x / (1 + exp(-2u)): the same function, but 1 + tanh(u) cancels
// catastrophically for x < -5 even in double.
double ref_gelu(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

// Central difference of a scalar function of one variable.
template <class F>
double fd(F f, double x) {
  const double h = 1e-5 * std::max(1.0, std::fabs(x));
  return (f(x + h) - f(x - h)) / (2 * h);
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST(Gelu, ForwardMatchesDoubleReference) {
  auto x = randn(1000, 1, 3.0f);
  for (float v : {0.0f, -0.0f, 1e-20f, -1e-20f, 1e-3f, 5.0f, -5.0f, 10.0f, -10.0f, 30.0f})
    x.push_back(v);
  std::vector<float> out(x.size());
  k::gelu_forward(out.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double want = ref_gelu(x[i]);
    ASSERT_NEAR(out[i], want, 1e-5 * std::fabs(want) + 1e-30) << "x=" << x[i];
  }
}

TEST(Gelu, ExtremeInputsStayFinite) {
  // exp saturates at exp(88) instead of overflowing, so far-negative inputs give a vanishing
  // (not NaN) output and gradient; far-positive inputs give exactly x and 1.
  std::vector<float> x = {-1e4f, -200.0f, -90.0f, 90.0f, 200.0f, 1e4f};
  std::vector<float> out(x.size()), dx(x.size()), ones(x.size(), 1.0f);
  k::gelu_forward(out.data(), x.data(), x.size());
  k::gelu_backward(dx.data(), ones.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    if (x[i] > 0) {
      EXPECT_EQ(out[i], x[i]);
      EXPECT_EQ(dx[i], 1.0f);
    } else {
      EXPECT_LE(std::fabs(out[i]), 1e-30f) << "x=" << x[i];
      EXPECT_LE(std::fabs(dx[i]), 1e-20f) << "x=" << x[i];
    }
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferencesAndOverwrites) {
  auto x = randn(257, 2, 2.5f), dout = randn(257, 3);
  std::vector<float> dx(x.size(), kNaN);  // backward writes: stale contents must not leak in
  k::gelu_backward(dx.data(), dout.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double want = dout[i] * fd(ref_gelu, x[i]);
    ASSERT_NEAR(dx[i], want, 1e-5 * std::fabs(want) + 1e-6) << "x=" << x[i];
  }
}

TEST(Gelu, IndependentOfThreadCount) {
  const size_t n = 3 * 4096 * 5 + 123;  // several blocks and a ragged end
  auto x = randn(n, 4, 3.0f), dout = randn(n, 5);
  auto run = [&](int threads) {
    Threads t(threads);
    std::vector<float> out(n), dx(n);
    k::gelu_forward(out.data(), x.data(), n);
    k::gelu_backward(dx.data(), dout.data(), x.data(), n);
    return std::pair{out, dx};
  };
  const auto a = run(1), b = run(3);
  EXPECT_TRUE(bitwise_equal(a.first, b.first));
  EXPECT_TRUE(bitwise_equal(a.second, b.second));
}

class SwiGluShapes : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(SwiGluShapes, ForwardMatchesDoubleReference) {
  const auto [N, F] = GetParam();
  auto gu = randn(N * 2 * F, 6, 2.0f);
  std::vector<float> out(N * F);
  k::swiglu_forward(out.data(), gu.data(), N, F);
  for (int i = 0; i < N; i++)
    for (int f = 0; f < F; f++) {
      const double want = ref_silu(gu[i * 2 * F + f]) * gu[i * 2 * F + F + f];
      ASSERT_NEAR(out[i * F + f], want, 1e-5 * std::fabs(want) + 1e-7) << i << "," << f;
    }
}

TEST_P(SwiGluShapes, BackwardMatchesFiniteDifferencesAndOverwrites) {
  const auto [N, F] = GetParam();
  auto gu = randn(N * 2 * F, 7, 2.0f), dout = randn(N * F, 8);
  std::vector<float> dgu(N * 2 * F, kNaN);
  k::swiglu_backward(dgu.data(), dout.data(), gu.data(), N, F);
  for (int i = 0; i < N; i++)
    for (int f = 0; f < F; f++) {
      const double g = gu[i * 2 * F + f], u = gu[i * 2 * F + F + f], d = dout[i * F + f];
      // loss = sum(dout * silu(g) * u): differentiate in g and in u separately.
      const double want_g = d * fd([&](double gg) { return ref_silu(gg) * u; }, g);
      const double want_u = d * fd([&](double uu) { return ref_silu(g) * uu; }, u);
      ASSERT_NEAR(dgu[i * 2 * F + f], want_g, 1e-5 * std::fabs(want_g) + 1e-6) << i << "," << f;
      ASSERT_NEAR(dgu[i * 2 * F + F + f], want_u, 1e-5 * std::fabs(want_u) + 1e-6) << i << "," << f;
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, SwiGluShapes,
                         ::testing::Values(std::pair{5, 7}, std::pair{5, 16}, std::pair{3, 37}));

TEST(SwiGlu, IndependentOfThreadCount) {
  const int N = 97, F = 131;
  auto gu = randn(N * 2 * F, 9, 3.0f), dout = randn(N * F, 10);
  auto run = [&](int threads) {
    Threads t(threads);
    std::vector<float> out(N * F), dgu(N * 2 * F);
    k::swiglu_forward(out.data(), gu.data(), N, F);
    k::swiglu_backward(dgu.data(), dout.data(), gu.data(), N, F);
    return std::pair{out, dgu};
  };
  const auto a = run(1), b = run(3);
  EXPECT_TRUE(bitwise_equal(a.first, b.first));
  EXPECT_TRUE(bitwise_equal(a.second, b.second));
}

TEST(SwiGlu, ExtremeGatesStayFinite) {
  const int F = 4;
  std::vector<float> gu = {-200.0f, -90.0f, 90.0f, 200.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> out(F), dgu(2 * F), dout(F, 1.0f);
  k::swiglu_forward(out.data(), gu.data(), 1, F);
  k::swiglu_backward(dgu.data(), dout.data(), gu.data(), 1, F);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  for (float v : dgu) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(out[3], 200.0f);
  EXPECT_EQ(dgu[3], 1.0f);
}

// The bf16 outputs (a bf16 product's operand, written without an fp32 activation or gradient) are
// the fp32 outputs rounded: the same bits as converting them.
TEST(Activation, Bf16OutputsAreTheFp32OutputsRounded) {
  const int N = 37, F = 4096 / 16 + 3;  // GELU over several blocks and a ragged end
  const size_t n = size_t(N) * F;
  auto x = randn(2 * n, 13, 3.0f);
  std::vector<float> out(n);
  std::vector<cleave::bf16> rounded(n);
  k::gelu_forward(out.data(), x.data(), n);
  k::gelu_forward(rounded.data(), x.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rounded[i], cleave::to_bf16(out[i])) << "gelu " << i;
  k::swiglu_forward(out.data(), x.data(), N, F);
  k::swiglu_forward(rounded.data(), x.data(), N, F);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(rounded[i], cleave::to_bf16(out[i])) << "swiglu " << i;

  // The backwards: the bf16 gradient is the fp32 one rounded.
  auto dout = randn(n, 14);
  auto check = [&](const char* what, auto backward, size_t count) {
    std::vector<float> f32(count);
    std::vector<cleave::bf16> rounded(count);
    backward(f32.data());
    backward(rounded.data());
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(rounded[i], cleave::to_bf16(f32[i])) << what << " " << i;
  };
  check("gelu", [&](auto* o) { k::gelu_backward(o, dout.data(), x.data(), n); }, n);
  check("swiglu", [&](auto* o) { k::swiglu_backward(o, dout.data(), x.data(), N, F); }, 2 * n);
}

// GELU's backward that also sums fc's bias gradient: the bf16 gradient is the fp32 one rounded,
// and the bias gets, added to what it held, each column of the fp32 gradient summed over the rows
// in order in double (LinearGemm's bias gradient), whatever the thread count.
TEST(Activation, GeluBackwardSumsTheBiasGradientOfItsFp32Values) {
  const int N = 37, F = 3 * 64 + 5;  // column blocks of the sum, the last one partial
  const size_t n = size_t(N) * F;
  auto x = randn(n, 15, 3.0f), dout = randn(n, 16);
  std::vector<float> f32(n);
  k::gelu_backward(f32.data(), dout.data(), x.data(), n);
  std::vector<float> expect = randn(F, 17);
  const std::vector<float> start = expect;
  for (int c = 0; c < F; ++c) {
    double acc = 0;
    for (int r = 0; r < N; ++r) acc += f32[size_t(r) * F + c];
    expect[c] = float(double(start[c]) + acc);
  }
  for (int threads : {1, 3}) {
    Threads t(threads);
    std::vector<float> bias = start;
    std::vector<cleave::bf16> rounded(n);
    k::gelu_backward_bias(rounded.data(), bias.data(), dout.data(), x.data(), N, F);
    EXPECT_TRUE(bitwise_equal(bias, expect)) << threads << " threads";
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(rounded[i], cleave::to_bf16(f32[i])) << i;
  }
}

TEST(AddInplace, AddsAndIsIndependentOfThreadCount) {
  const size_t n = 4096 * 3 + 17;
  auto x = randn(n, 11), y0 = randn(n, 12);
  auto run = [&](int threads) {
    Threads t(threads);
    auto y = y0;
    k::add_inplace(y.data(), x.data(), n);
    return y;
  };
  const auto a = run(1), b = run(3);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(a[i], y0[i] + x[i]) << i;
  EXPECT_TRUE(bitwise_equal(a, b));
}

TEST(Activation, RejectsBadSizes) {
  std::vector<float> buf(64, 1.0f);
  float* p = buf.data();
  EXPECT_THROW(k::gelu_forward(p, p, -1), cleave::Error);
  EXPECT_THROW(k::gelu_backward(p, p, p, -1), cleave::Error);
  EXPECT_THROW(k::swiglu_forward(p, p, 2, 0), cleave::Error);
  EXPECT_THROW(k::swiglu_backward(p, p, p, -1, 4), cleave::Error);
  EXPECT_THROW(k::add_inplace(p, p, -5), cleave::Error);
  k::gelu_forward(p, p, 0);  // empty is fine
}
