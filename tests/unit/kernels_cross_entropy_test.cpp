// Fused cross-entropy against a double log-softmax reference and central finite differences of
// grad_scale * sum_i loss_i; grad_scale = 0 leaves logits alone; thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/cross_entropy.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

// -log_softmax(row)[target] in double.
double ref_loss(const double* row, int V, int target) {
  double m = row[0];
  for (int j = 1; j < V; j++) m = std::max(m, row[j]);
  double s = 0;
  for (int j = 0; j < V; j++) s += std::exp(row[j] - m);
  return m + std::log(s) - row[target];
}

struct Shape {
  int64_t N;
  int V;
  float scale, shift;  // logits ~ shift + scale * N(0, 1)
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "N=" << s.N << " V=" << s.V << " scale=" << s.scale << " shift=" << s.shift;
}

}  // namespace

class CrossEntropyShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(CrossEntropyShapes, LossMatchesLogSoftmax) {
  const Shape s = GetParam();
  auto logits = randn(s.N * s.V, 1, s.scale, s.shift);
  const auto targets = random_ids(s.N, s.V, 2);
  const auto orig = logits;
  std::vector<float> losses(s.N);
  k::cross_entropy_forward_backward(logits.data(), losses.data(), targets.data(), s.N, s.V, 0.0f);
  EXPECT_TRUE(bitwise_equal(logits, orig)) << "grad_scale = 0 must leave the logits untouched";
  for (int64_t i = 0; i < s.N; i++) {
    std::vector<double> row(orig.begin() + i * s.V, orig.begin() + (i + 1) * s.V);
    const double want = ref_loss(row.data(), s.V, targets[i]);
    // float logits of size up to ~|shift|: the loss is a difference of two such numbers.
    EXPECT_NEAR(losses[i], want, 1e-5 * std::max(1.0, std::fabs(double(s.shift)))) << "row " << i;
  }
}

TEST_P(CrossEntropyShapes, GradientMatchesFiniteDifferences) {
  const Shape s = GetParam();
  const float grad_scale = 1.0f / 3.0f;
  auto logits = randn(s.N * s.V, 3, s.scale, s.shift);
  const auto targets = random_ids(s.N, s.V, 4);
  const auto orig = logits;
  std::vector<float> losses(s.N), losses0(s.N);
  auto copy = orig;
  k::cross_entropy_forward_backward(copy.data(), losses0.data(), targets.data(), s.N, s.V, 0.0f);
  k::cross_entropy_forward_backward(logits.data(), losses.data(), targets.data(), s.N, s.V,
                                    grad_scale);
  EXPECT_TRUE(bitwise_equal(losses, losses0)) << "the loss must not depend on grad_scale";
  for (int64_t i = 0; i < s.N; i++) {
    std::vector<double> row(orig.begin() + i * s.V, orig.begin() + (i + 1) * s.V);
    double gsum = 0;
    for (int j = 0; j < s.V; j++) {
      const double h = 1e-4, x0 = row[j];
      row[j] = x0 + h;
      const double lp = ref_loss(row.data(), s.V, targets[i]);
      row[j] = x0 - h;
      const double lm = ref_loss(row.data(), s.V, targets[i]);
      row[j] = x0;
      const double want = grad_scale * (lp - lm) / (2 * h);
      ASSERT_NEAR(logits[i * s.V + j], want, 1e-7 + 2e-5 * std::fabs(want)) << i << "," << j;
      gsum += logits[i * s.V + j];
    }
    EXPECT_NEAR(gsum, 0.0, 1e-6) << "softmax - onehot sums to zero, row " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CrossEntropyShapes,
                         ::testing::Values(Shape{5, 7, 1.0f, 0.0f}, Shape{5, 16, 2.0f, 0.0f},
                                           Shape{4, 64, 3.0f, 0.0f}, Shape{3, 200, 2.0f, -1.0f},
                                           Shape{3, 333, 5.0f, 50.0f}, Shape{2, 1, 1.0f, 0.0f}));

TEST(CrossEntropy, LargeLogitsAreStable) {
  const int V = 100;
  std::vector<float> logits(V, -1e4f);
  logits[3] = 1e4f;
  logits[50] = 1e4f - 1.0f;
  logits[99] = -std::numeric_limits<float>::infinity();  // a masked entry
  std::vector<float> losses(1);
  std::vector<int32_t> t = {50};
  k::cross_entropy_forward_backward(logits.data(), losses.data(), t.data(), 1, V, 1.0f);
  // lse = 1e4 + log(1 + e^-1) (the -1e4 entries add ~e^-2e4); loss = lse - (1e4 - 1). The
  // tolerance is half an ulp of 1e4, the magnitude lse is held at.
  EXPECT_NEAR(losses[0], 1.0 + std::log1p(std::exp(-1.0)), 5e-4);
  for (float g : logits) EXPECT_TRUE(std::isfinite(g));
  EXPECT_EQ(logits[99], 0.0f);
  EXPECT_NEAR(logits[3], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(logits[50], 1.0 / (1.0 + std::exp(1.0)) - 1.0, 1e-6);
}

TEST(CrossEntropy, IndependentOfThreadCount) {
  const int64_t N = 67;
  const int V = 1000;
  const auto logits = randn(N * V, 5, 3.0f);
  const auto targets = random_ids(N, V, 6);
  auto run = [&](int threads) {
    Threads t(threads);
    auto l = logits;
    std::vector<float> losses(N);
    k::cross_entropy_forward_backward(l.data(), losses.data(), targets.data(), N, V, 1.0f / N);
    return std::pair{l, losses};
  };
  const auto a = run(1), b = run(3);
  EXPECT_TRUE(bitwise_equal(a.first, b.first));
  EXPECT_TRUE(bitwise_equal(a.second, b.second));
}

TEST(CrossEntropy, RejectsBadTargetsNamingRowAndValue) {
  const int V = 10;
  std::vector<float> logits(3 * V, 0.0f), losses(3);
  std::vector<int32_t> t = {1, 2, V};
  try {
    k::cross_entropy_forward_backward(logits.data(), losses.data(), t.data(), 3, V, 1.0f);
    FAIL() << "expected cleave::Error";
  } catch (const cleave::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("is 10"), std::string::npos) << msg;
  }
  t = {-1, 0, 0};
  auto run = [&](int64_t N, int V_) {
    k::cross_entropy_forward_backward(logits.data(), losses.data(), t.data(), N, V_, 1.0f);
  };
  EXPECT_THROW(run(3, V), cleave::Error);
  t = {0, 0, 0};
  EXPECT_THROW(run(3, 0), cleave::Error);
  EXPECT_THROW(run(-1, V), cleave::Error);
}
