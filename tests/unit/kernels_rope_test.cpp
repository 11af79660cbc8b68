// RoPE (rotate-half) against a double-precision reference; backward is the transpose (finite
// differences of sum(dout * rope(x))) and the inverse; per-row positions (offsets, restarting
// documents, zigzag pieces); thread-count independence; out-of-range positions.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/rope.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

constexpr float kTheta = 10000.0f;


// Double reference of the forward on the same layout; untouched columns are copied through.
std::vector<double> ref_rope(const std::vector<double>& x, int hd, const std::vector<int32_t>& pos,
                             int H, int64_t stride) {
  std::vector<double> y = x;
  const int half = hd / 2;
  for (size_t r = 0; r < pos.size(); r++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < half; i++) {
        const double a = pos[r] * std::pow(double(kTheta), -2.0 * i / hd);
        const int64_t j = int64_t(r) * stride + h * hd + i;
        y[j] = x[j] * std::cos(a) - x[j + half] * std::sin(a);
        y[j + half] = x[j + half] * std::cos(a) + x[j] * std::sin(a);
      }
  return y;
}

struct Shape {
  int hd;
  int64_t B, T;
  int H;
  int64_t stride, off;
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "hd=" << s.hd << " B=" << s.B << " T=" << s.T << " H=" << s.H << " stride=" << s.stride
      << " off=" << s.off;
}

}  // namespace

TEST(Rope, TableMatchesDouble) {
  const int hd = 16;
  k::RopeTable tab(hd, 4096, kTheta);
  tab.ensure_computed();
  for (int64_t p : {0, 1, 7, 1000, 4095})
    for (int i = 0; i < hd / 2; i++) {
      const double a = p * std::pow(10000.0, -2.0 * i / hd);
      ASSERT_NEAR(tab.cos_row(p)[i], std::cos(a), 1e-7) << p << "," << i;
      ASSERT_NEAR(tab.sin_row(p)[i], std::sin(a), 1e-7) << p << "," << i;
    }
}

class RopeShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(RopeShapes, ForwardMatchesDoubleReference) {
  const Shape s = GetParam();
  k::RopeTable tab(s.hd, 64, kTheta);
  const auto pos = sequence_positions(s.B, s.T, s.off);
  auto x = randn(s.B * s.T * s.stride, 1);
  auto y = x;
  k::rope_forward(y.data(), tab, s.B * s.T, s.H, s.stride, pos.data());
  const auto want = ref_rope({x.begin(), x.end()}, s.hd, pos, s.H, s.stride);
  for (size_t j = 0; j < y.size(); j++) ASSERT_NEAR(y[j], want[j], 1e-6) << j;
}

TEST_P(RopeShapes, BackwardIsTransposeAndInverse) {
  const Shape s = GetParam();
  k::RopeTable tab(s.hd, 64, kTheta);
  const auto pos = sequence_positions(s.B, s.T, s.off);
  const int64_t rows = s.B * s.T;
  auto x = randn(rows * s.stride, 2), dout = randn(x.size(), 3);
  // d/dx sum(dout * rope(x)) by central differences on the double reference.
  std::vector<double> xd(x.begin(), x.end()), dd(dout.begin(), dout.end());
  auto loss = [&] {
    const auto y = ref_rope(xd, s.hd, pos, s.H, s.stride);
    double l = 0;
    for (size_t j = 0; j < y.size(); j++) l += dd[j] * y[j];
    return l;
  };
  auto dx = dout;
  k::rope_backward(dx.data(), tab, rows, s.H, s.stride, pos.data());
  for (size_t j = 0; j < xd.size(); j++) {
    const double h = 1e-5, x0 = xd[j];
    xd[j] = x0 + h;
    const double lp = loss();
    xd[j] = x0 - h;
    const double lm = loss();
    xd[j] = x0;
    ASSERT_NEAR(dx[j], (lp - lm) / (2 * h), 1e-5) << j;
  }
  // Rotations are orthogonal: backward undoes forward.
  auto y = x;
  k::rope_forward(y.data(), tab, rows, s.H, s.stride, pos.data());
  k::rope_backward(y.data(), tab, rows, s.H, s.stride, pos.data());
  for (size_t j = 0; j < y.size(); j++) ASSERT_NEAR(y[j], x[j], 1e-6) << j;
}

INSTANTIATE_TEST_SUITE_P(Kernels, RopeShapes,
                         ::testing::Values(Shape{16, 1, 5, 1, 16, 0}, Shape{16, 2, 5, 3, 48, 7},
                                           Shape{8, 2, 3, 2, 21, 0},  // stride > H * hd
                                           Shape{6, 1, 4, 2, 12, 11}));

TEST(Rope, PositionOffsetMatchesSliceOfLongerSequence) {
  const int hd = 16, H = 2, T = 12, off = 5, Tq = 4;
  k::RopeTable tab(hd, 32, kTheta);
  auto x = randn(T * H * hd, 4);
  auto full = x;
  k::rope_forward(full.data(), tab, T, H, H * hd, sequence_positions(1, T, 0).data());
  // Tokens [off, off + Tq) alone, at positions off.., must equal those rows of the full run.
  std::vector<float> part(x.begin() + off * H * hd, x.begin() + (off + Tq) * H * hd);
  k::rope_forward(part.data(), tab, Tq, H, H * hd, sequence_positions(1, Tq, off).data());
  EXPECT_TRUE(bitwise_equal(part.data(), full.data() + off * H * hd, part.size()));
}

TEST(Rope, EachRowTakesItsOwnPosition) {
  const std::vector<int32_t> pos = restart_and_zigzag_positions();
  const int hd = 16, H = 3;
  const int64_t rows = int64_t(pos.size()), stride = H * hd + 5;
  k::RopeTable tab(hd, 32, kTheta);
  const auto x = randn(rows * stride, 6);
  auto y = x;
  k::rope_forward(y.data(), tab, rows, H, stride, pos.data());
  const auto want = ref_rope({x.begin(), x.end()}, hd, pos, H, stride);
  for (size_t j = 0; j < y.size(); j++) ASSERT_NEAR(y[j], want[j], 1e-6) << j;
  // A row's rotation depends on its position alone, bit for bit: the zigzag rows equal the same
  // rows placed at their positions in one sequence of 32 tokens.
  auto full = randn(32 * stride, 7);
  for (int64_t r = 16; r < rows; r++)
    std::copy(x.begin() + r * stride, x.begin() + (r + 1) * stride,
              full.begin() + pos[r] * stride);
  k::rope_forward(full.data(), tab, 32, H, stride, sequence_positions(1, 32, 0).data());
  for (int64_t r = 16; r < rows; r++)
    EXPECT_TRUE(bitwise_equal(y.data() + r * stride, full.data() + pos[r] * stride, stride)) << r;
  // Backward with the same positions undoes it.
  k::rope_backward(y.data(), tab, rows, H, stride, pos.data());
  for (size_t j = 0; j < y.size(); j++) ASSERT_NEAR(y[j], x[j], 1e-6) << j;
}

TEST(Rope, IndependentOfThreadCount) {
  const int hd = 64, H = 6;
  const int64_t B = 3, T = 37, stride = 3 * H * hd;  // q, k, v interleaved per row
  k::RopeTable tab(hd, 128, kTheta);
  const auto x = randn(B * T * stride, 5);
  const auto pos = sequence_positions(B, T, 9);
  auto run = [&](int threads) {
    Threads t(threads);
    auto y = x;
    k::rope_forward(y.data(), tab, B * T, H, stride, pos.data());
    k::rope_backward(y.data() + H * hd, tab, B * T, H, stride, pos.data());
    return y;
  };
  const auto a = run(1), b = run(3);
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), a.size()));
}

TEST(Rope, RejectsBadArguments) {
  EXPECT_THROW(k::RopeTable(7, 16, kTheta), cleave::Error);  // odd head_dim
  EXPECT_THROW(k::RopeTable(0, 16, kTheta), cleave::Error);
  EXPECT_THROW(k::RopeTable(8, 16, 0.0f), cleave::Error);
  k::RopeTable tab(8, 16, kTheta);
  std::vector<float> x(4 * 16 * 16, 0.0f);
  const auto pos = sequence_positions(1, 16, 0);
  EXPECT_THROW(k::rope_forward(x.data(), tab, 4, 2, 15, pos.data()), cleave::Error);  // < 2*8
  EXPECT_THROW(k::rope_backward(x.data(), tab, 4, 0, 8, pos.data()), cleave::Error);
  EXPECT_THROW(k::rope_backward(x.data(), tab, -1, 1, 8, pos.data()), cleave::Error);
  EXPECT_THROW(k::rope_forward(x.data(), tab, 4, 1, 8, nullptr), cleave::Error);
  k::rope_forward(x.data(), tab, 16, 1, 8, pos.data());  // positions 0..max_pos-1 are fine
  k::rope_forward(x.data(), tab, 0, 1, 8, nullptr);      // no rows, no positions
}

TEST(Rope, RejectsPositionsOutOfRange) {
  k::RopeTable tab(8, 16, kTheta);
  std::vector<float> x(4 * 8, 0.0f);
  const std::vector<int32_t> high = {3, 16, 0, 1}, neg = {0, 1, -2, 3};
  EXPECT_THROW(k::rope_forward(x.data(), tab, 4, 1, 8, high.data()), cleave::Error);
  EXPECT_THROW(k::rope_forward(x.data(), tab, 4, 1, 8, neg.data()), cleave::Error);
  EXPECT_THROW(k::rope_backward(x.data(), tab, 4, 1, 8, high.data()), cleave::Error);
  EXPECT_THROW(k::rope_backward(x.data(), tab, 4, 1, 8, neg.data()), cleave::Error);
  try {
    k::rope_forward(x.data(), tab, 4, 1, 8, high.data());
    FAIL() << "no error";
  } catch (const cleave::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("row 1"), std::string::npos) << what;
    EXPECT_NE(what.find("position 16"), std::string::npos) << what;
  }
}
