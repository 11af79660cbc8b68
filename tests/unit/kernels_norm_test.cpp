// LayerNorm / RMSNorm kernels against a double-precision reference, central finite differences
// of sum(dout * out), the += contract, and bitwise independence from the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/norm.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// a == b + c up to the rounding of one fused multiply-add (the kernels may contract dx += s * v).
void expect_sum(float a, float b, float c, size_t i) {
  ASSERT_NEAR(a, b + c, 1e-6f * (std::fabs(b) + std::fabs(c)) + 1e-30f) << "at " << i;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                  double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
}

// d/dp of f at p, for every element of p, by central differences.
std::vector<double> fd_grad(std::vector<double>& p, const std::function<double()>& f) {
  std::vector<double> g(p.size());
  for (size_t i = 0; i < p.size(); i++) {
    const double h = 1e-5 * std::max(1.0, std::fabs(p[i]));
    const double p0 = p[i];
    p[i] = p0 + h;
    const double fp = f();
    p[i] = p0 - h;
    const double fm = f();
    p[i] = p0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Reference forwards in double; they return sum(dout * out) and optionally out, mean, rstd.
double ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b, const std::vector<double>& dout, int N, int C,
                     double eps, std::vector<double>* out = nullptr,
                     std::vector<double>* mean = nullptr, std::vector<double>* rstd = nullptr) {
  double loss = 0;
  for (int i = 0; i < N; i++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[i * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + eps);
    if (mean) (*mean)[i] = m;
    if (rstd) (*rstd)[i] = s;
    for (int c = 0; c < C; c++) {
      const double o = (x[i * C + c] - m) * s * w[c] + b[c];
      if (out) (*out)[i * C + c] = o;
      loss += dout[i * C + c] * o;
    }
  }
  return loss;
}

double ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w,
                   const std::vector<double>& dout, int N, int C, double eps,
                   std::vector<double>* out = nullptr, std::vector<double>* rstd = nullptr) {
  double loss = 0;
  for (int i = 0; i < N; i++) {
    double ms = 0;
    for (int c = 0; c < C; c++) ms += x[i * C + c] * x[i * C + c];
    const double s = 1.0 / std::sqrt(ms / C + eps);
    if (rstd) (*rstd)[i] = s;
    for (int c = 0; c < C; c++) {
      const double o = x[i * C + c] * s * w[c];
      if (out) (*out)[i * C + c] = o;
      loss += dout[i * C + c] * o;
    }
  }
  return loss;
}

constexpr float kEps = 1e-5f;

}  // namespace

class LayerNormShapes : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(LayerNormShapes, ForwardMatchesDoubleReference) {
  const auto [N, C] = GetParam();
  auto x = randn(N * C, 1, 2.0f, 0.5f), w = randn(C, 2, 0.5f, 1.0f), b = randn(C, 3);
  std::vector<float> out(N * C), mean(N), rstd(N);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       kEps);
  std::vector<double> ro(N * C), rm(N), rs(N), zero(N * C, 0.0);
  ref_layernorm(to_d(x), to_d(w), to_d(b), zero, N, C, kEps, &ro, &rm, &rs);
  expect_close(out, ro, 1e-5, 1e-6, "out");
  expect_close(mean, rm, 1e-6, 1e-7, "mean");
  expect_close(rstd, rs, 1e-6, 0, "rstd");
}

TEST_P(LayerNormShapes, BackwardMatchesFiniteDifferences) {
  const auto [N, C] = GetParam();
  auto x = randn(N * C, 4, 1.5f, -0.3f), w = randn(C, 5, 0.5f, 1.0f), b = randn(C, 6);
  auto dout = randn(N * C, 7);
  std::vector<float> out(N * C), mean(N), rstd(N);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       kEps);
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  k::layernorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                              N, C);
  k::layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                               rstd.data(), N, C);

  auto xd = to_d(x), wd = to_d(w), bd = to_d(b), gd = to_d(dout);
  auto loss = [&] { return ref_layernorm(xd, wd, bd, gd, N, C, kEps); };
  expect_close(dx, fd_grad(xd, loss), 2e-5, 2e-5, "dx");
  expect_close(dw, fd_grad(wd, loss), 2e-5, 2e-5, "dweight");
  expect_close(db, fd_grad(bd, loss), 2e-5, 2e-5, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Kernels, LayerNormShapes,
                         ::testing::Values(std::pair{5, 7}, std::pair{5, 16}, std::pair{3, 37},
                                           std::pair{150, 16}));

TEST(LayerNorm, BackwardAccumulates) {
  const int N = 130, C = 33;  // several row chunks in backward_weight
  auto x = randn(N * C, 10), w = randn(C, 11), b = randn(C, 12), dout = randn(N * C, 13);
  std::vector<float> out(N * C), mean(N), rstd(N);
  k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                       kEps);
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  k::layernorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                              N, C);
  k::layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                               rstd.data(), N, C);
  auto dx0 = randn(N * C, 14), dw0 = randn(C, 15), db0 = randn(C, 16);
  auto dx1 = dx0, dw1 = dw0, db1 = db0;
  k::layernorm_backward_input(dx1.data(), dout.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), N, C);
  k::layernorm_backward_weight(dw1.data(), db1.data(), dout.data(), x.data(), mean.data(),
                               rstd.data(), N, C);
  for (int i = 0; i < N * C; i++) expect_sum(dx1[i], dx0[i], dx[i], i);
  for (int c = 0; c < C; c++) {
    expect_sum(dw1[c], dw0[c], dw[c], c);
    expect_sum(db1[c], db0[c], db[c], c);
  }
}

TEST(LayerNorm, NullBias) {
  const int N = 4, C = 9;
  auto x = randn(N * C, 20), w = randn(C, 21), dout = randn(N * C, 22);
  std::vector<float> zero(C, 0.0f), o1(N * C), o2(N * C), mean(N), rstd(N), dw(C, 0.0f);
  k::layernorm_forward(o1.data(), mean.data(), rstd.data(), x.data(), w.data(), zero.data(), N, C,
                       kEps);
  k::layernorm_forward(o2.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                       kEps);
  EXPECT_TRUE(bitwise_equal(o1, o2));
  k::layernorm_backward_weight(dw.data(), nullptr, dout.data(), x.data(), mean.data(), rstd.data(),
                               N, C);
}

TEST(LayerNorm, IndependentOfThreadCount) {
  const int N = 333, C = 77;
  auto x = randn(N * C, 30), w = randn(C, 31), b = randn(C, 32), dout = randn(N * C, 33);
  auto run = [&](int threads) {
    Threads t(threads);
    std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.5f), dw(C, 0.25f), db(C, 0.0f);
    k::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                         kEps);
    k::layernorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C);
    k::layernorm_backward_weight(dw.data(), db.data(), dout.data(), x.data(), mean.data(),
                                 rstd.data(), N, C);
    return std::vector<std::vector<float>>{out, mean, rstd, dx, dw, db};
  };
  const auto a = run(1), b3 = run(3), again = run(3);
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_TRUE(bitwise_equal(a[i], b3[i])) << "array " << i;
    EXPECT_TRUE(bitwise_equal(b3[i], again[i])) << "array " << i;
  }
}

TEST(LayerNorm, RejectsBadSizes) {
  std::vector<float> buf(64, 1.0f);
  float* p = buf.data();
  EXPECT_THROW(k::layernorm_forward(p, p, p, p, p, p, 2, 0, kEps), cleave::Error);
  EXPECT_THROW(k::layernorm_forward(p, p, p, p, p, p, -1, 4, kEps), cleave::Error);
  EXPECT_THROW(k::layernorm_backward_input(p, p, p, p, p, p, 2, -3), cleave::Error);
  EXPECT_THROW(k::layernorm_backward_weight(p, p, p, p, p, p, 2, 0), cleave::Error);
}

class RmsNormShapes : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(RmsNormShapes, ForwardMatchesDoubleReference) {
  const auto [N, C] = GetParam();
  auto x = randn(N * C, 40, 2.0f, 0.5f), w = randn(C, 41, 0.5f, 1.0f);
  std::vector<float> out(N * C), rstd(N);
  k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  std::vector<double> ro(N * C), rs(N), zero(N * C, 0.0);
  ref_rmsnorm(to_d(x), to_d(w), zero, N, C, kEps, &ro, &rs);
  expect_close(out, ro, 1e-5, 1e-6, "out");
  expect_close(rstd, rs, 1e-6, 0, "rstd");
}

TEST_P(RmsNormShapes, BackwardMatchesFiniteDifferences) {
  const auto [N, C] = GetParam();
  auto x = randn(N * C, 42, 1.5f, -0.3f), w = randn(C, 43, 0.5f, 1.0f), dout = randn(N * C, 44);
  std::vector<float> out(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  k::rmsnorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  k::rmsnorm_backward_weight(dw.data(), dout.data(), x.data(), rstd.data(), N, C);
  auto xd = to_d(x), wd = to_d(w), gd = to_d(dout);
  auto loss = [&] { return ref_rmsnorm(xd, wd, gd, N, C, kEps); };
  expect_close(dx, fd_grad(xd, loss), 2e-5, 2e-5, "dx");
  expect_close(dw, fd_grad(wd, loss), 2e-5, 2e-5, "dweight");
}

INSTANTIATE_TEST_SUITE_P(Kernels, RmsNormShapes,
                         ::testing::Values(std::pair{5, 7}, std::pair{5, 16}, std::pair{3, 37},
                                           std::pair{150, 16}));

TEST(RmsNorm, BackwardAccumulates) {
  const int N = 130, C = 33;
  auto x = randn(N * C, 50), w = randn(C, 51), dout = randn(N * C, 52);
  std::vector<float> out(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  k::rmsnorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  k::rmsnorm_backward_weight(dw.data(), dout.data(), x.data(), rstd.data(), N, C);
  auto dx0 = randn(N * C, 53), dw0 = randn(C, 54);
  auto dx1 = dx0, dw1 = dw0;
  k::rmsnorm_backward_input(dx1.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  k::rmsnorm_backward_weight(dw1.data(), dout.data(), x.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; i++) expect_sum(dx1[i], dx0[i], dx[i], i);
  for (int c = 0; c < C; c++) expect_sum(dw1[c], dw0[c], dw[c], c);
}

TEST(RmsNorm, IndependentOfThreadCount) {
  const int N = 333, C = 77;
  auto x = randn(N * C, 60), w = randn(C, 61), dout = randn(N * C, 62);
  auto run = [&](int threads) {
    Threads t(threads);
    std::vector<float> out(N * C), rstd(N), dx(N * C, 0.5f), dw(C, 0.25f);
    k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
    k::rmsnorm_backward_input(dx.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    k::rmsnorm_backward_weight(dw.data(), dout.data(), x.data(), rstd.data(), N, C);
    return std::vector<std::vector<float>>{out, rstd, dx, dw};
  };
  const auto a = run(1), b = run(3);
  for (size_t i = 0; i < a.size(); i++) EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "array " << i;
}

TEST(RmsNorm, RejectsBadSizes) {
  std::vector<float> buf(64, 1.0f);
  float* p = buf.data();
  EXPECT_THROW(k::rmsnorm_forward(p, p, p, p, 2, 0, kEps), cleave::Error);
  EXPECT_THROW(k::rmsnorm_forward(p, p, p, p, -2, 4, kEps), cleave::Error);
  EXPECT_THROW(k::rmsnorm_backward_input(p, p, p, p, p, 2, 0), cleave::Error);
  EXPECT_THROW(k::rmsnorm_backward_weight(p, p, p, p, 2, -1), cleave::Error);
}
