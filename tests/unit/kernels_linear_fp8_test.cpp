// LinearGemm's fp8 mode against a double-precision reference that quantises each operand by the
// recipe's rules on its own (tile by tile, scales from each tile's largest magnitude, or the
// given per-tensor scales) and multiplies the dequantised values: every recipe, with bias, with
// accumulation, with kept FP8 copies (the same bits as without), shapes with ragged tiles; the
// delayed recipe's amax record and rescale; current scales through an amax reducer; the bytes
// the planner counts for these kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cleave/kernels/fp8.h"
#include "cleave/kernels/linear.h"
#include "cleave/kernels/linear_fp8.h"

namespace cleave {
namespace {

using kernels::Fp8Format;
using kernels::Fp8Recipe;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = normal(rng);
  return v;
}

// Odd rows and columns x 2^row_exp and 2^col_exp. A power-of-two scale changes a value's
// quantisation only where the tile's range pushes it below the format's normals, so the tiles
// along rows and along columns quantise alike unless their ranges differ this much (E4M3 spans
// 2^18 with subnormals, E5M2 2^32).
std::vector<float> shaped(std::vector<float> v, int64_t cols, int row_exp, int col_exp) {
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t r = int64_t(i) / cols, c = int64_t(i) % cols;
    v[i] = std::ldexp(v[i], row_exp * int(r % 2) + col_exp * int(c % 2));
  }
  return v;
}

// v [rows, cols] quantised in tiles of tr x tc and dequantised, in double; per_tensor_scale > 0
// gives every element that scale instead of its tile's.
std::vector<double> dequantised(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t tr,
                                int64_t tc, Fp8Format f, float per_tensor_scale = 0) {
  std::vector<double> out(v.size());
  for (int64_t r0 = 0; r0 < rows; r0 += tr)
    for (int64_t c0 = 0; c0 < cols; c0 += tc) {
      const int64_t r1 = std::min(rows, r0 + tr), c1 = std::min(cols, c0 + tc);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[size_t(r * cols + c)]));
      const float s = per_tensor_scale > 0 ? per_tensor_scale : kernels::fp8_tile_scale(amax, f);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = size_t(r * cols + c);
          out[i] = double(kernels::fp8_decode(kernels::fp8_encode(v[i] * s, f), f)) / s;
        }
    }
  return out;
}

// C[M, Nc] = A[M, K] B[K, Nc] with A(m, k) = a[m * as + k * ak] and so on, plus |.| sums.
struct Product {
  std::vector<double> val, mag;
};
Product multiply(const std::vector<double>& a, int64_t as, int64_t ak, const std::vector<double>& b,
                 int64_t bk, int64_t bn, int64_t M, int64_t K, int64_t Nc) {
  Product p{std::vector<double>(size_t(M * Nc)), std::vector<double>(size_t(M * Nc))};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < Nc; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const double t = a[size_t(m * as + k * ak)] * b[size_t(k * bk + n * bn)];
        p.val[size_t(m * Nc + n)] += t;
        p.mag[size_t(m * Nc + n)] += std::fabs(t);
      }
  return p;
}

void expect_close(const std::vector<float>& got, const Product& want,
                  const std::vector<float>& base, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double b = base.empty() ? 0.0 : base[i];
    const double tol = 1e-5 * (want.mag[i] + std::fabs(b)) + 1e-30;
    if (!(std::fabs(got[i] - (b + want.val[i])) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "] got " << got[i] << " want " << b + want.val[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Case {
  Fp8Recipe recipe;
  int64_t N;
  int in, out;
};

std::string case_name(const Case& c) {
  const char* names[] = {"delayed", "current", "blockwise", "mxfp8"};
  return std::string(names[int(c.recipe)]) + "_N" + std::to_string(c.N) + "_in" +
         std::to_string(c.in) + "_out" + std::to_string(c.out);
}

class LinearFp8Test : public ::testing::TestWithParam<Case> {};

TEST_P(LinearFp8Test, ProductsOfQuantisedOperands) {
  const auto [recipe, N, in, out] = GetParam();
  const bool per_tensor = recipe == Fp8Recipe::delayed || recipe == Fp8Recipe::current;
  const int64_t B = recipe == Fp8Recipe::mxfp8 ? 32 : 128;
  // Tiles along the tokens (the weight gradient's) span 2^34 in x and dy, and W's along its
  // rows (backward_input's, mxfp8) 2^20; the products balance the terms (dy's odd rows and
  // columns small where x's and W's odd rows are large), so every tile orientation shows.
  auto w = shaped(random_vec(size_t(out) * in, 1, 0.05f), in, 20, 0);
  auto x = shaped(random_vec(size_t(N) * in, 2, 1.0f), in, 34, 0);
  auto dy = shaped(random_vec(size_t(N) * out, 3, 1e-4f), out, -34, -20);
  auto bias = random_vec(size_t(out), 4, 0.1f);
  LinearGemm g(in, out, Precision::fp8);
  g.set_fp8({recipe, 0, nullptr, nullptr});
  g.set_weight(w.data());
  // Per-tensor scales: set ones (delayed) or each tensor's own (current).
  const Fp8Triple set = {3.0f, 500.0f, 2e8f};
  auto amax = [](const std::vector<float>& v) {
    return kernels::abs_max(v.data(), int64_t(v.size()));
  };
  const Fp8Triple scales = recipe == Fp8Recipe::delayed ? set
                           : recipe == Fp8Recipe::current
                               ? Fp8Triple{448.0f / amax(x), 448.0f / amax(w), 57344.0f / amax(dy)}
                               : Fp8Triple{0.0f, 0.0f, 0.0f};
  if (recipe == Fp8Recipe::delayed) g.set_fp8_scales(set);
  const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  // Each product's operands, tiled along its inner dimension.
  const auto xf =
      per_tensor ? dequantised(x, N, in, N, in, e4, scales[0]) : dequantised(x, N, in, 1, B, e4);
  const auto dyf = per_tensor ? dequantised(dy, N, out, N, out, e5, scales[2])
                              : dequantised(dy, N, out, 1, B, e5);
  const auto xw = per_tensor ? xf : dequantised(x, N, in, B, 1, e4);
  const auto dyw = per_tensor ? dyf : dequantised(dy, N, out, B, 1, e5);
  const int64_t wtr = recipe == Fp8Recipe::blockwise ? 128 : 1,
                wtc = recipe == Fp8Recipe::blockwise ? 128 : 32;
  const auto wf = per_tensor ? dequantised(w, out, in, out, in, e4, scales[1])
                             : dequantised(w, out, in, wtr, wtc, e4);
  const auto wb =
      per_tensor || recipe == Fp8Recipe::blockwise ? wf : dequantised(w, out, in, 32, 1, e4);

  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in);
  OperandCopy keep_x, keep_dy;
  g.forward(y.data(), x.data(), N, bias.data(), &keep_x);
  Product fy = multiply(xf, in, 1, wf, 1, in, N, in, out);
  for (int64_t n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) fy.val[size_t(n * out + o)] += bias[size_t(o)];
  expect_close(y, fy, {}, "forward");

  const auto dx0 = random_vec(dx.size(), 5, 1e-3f);
  dx = dx0;
  g.backward_input(dx.data(), dy.data(), N, true, &keep_dy);
  expect_close(dx, multiply(dyf, out, 1, wb, in, 1, N, out, in), dx0, "backward_input +=");
  g.backward_input(dx.data(), dy.data(), N, false);
  expect_close(dx, multiply(dyf, out, 1, wb, in, 1, N, out, in), {}, "backward_input");

  const auto dw0 = random_vec(dw.size(), 6, 1e-3f);
  dw = dw0;
  g.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N);
  expect_close(dw, multiply(dyw, 1, out, xw, in, 1, out, N, in), dw0, "backward_weight");
  // The kept FP8 copies give the same bits as quantising again.
  std::vector<float> dw_kept = dw0;
  g.backward_weight(dw_kept.data(), nullptr, dy.data(), x.data(), N, &keep_dy, &keep_x);
  EXPECT_EQ(dw_kept, dw);
  EXPECT_EQ(keep_x.count, N * in);
  EXPECT_GE(keep_x.fp8.size(), N * in);
  EXPECT_EQ(keep_x.data.size(), 0) << "no bf16 copy in fp8 mode";
  // The copy a recompute rebuilds is the one forward kept.
  OperandCopy rebuilt;
  g.copy_operand(x.data(), N * in, rebuilt);
  EXPECT_TRUE(std::equal(rebuilt.fp8.data(), rebuilt.fp8.data() + N * in, keep_x.fp8.data()));
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearFp8Test,
                         ::testing::Values(Case{Fp8Recipe::delayed, 37, 70, 45},
                                           Case{Fp8Recipe::current, 37, 70, 45},
                                           Case{Fp8Recipe::blockwise, 150, 200, 130},
                                           Case{Fp8Recipe::blockwise, 9, 64, 32},
                                           Case{Fp8Recipe::mxfp8, 70, 100, 45},
                                           Case{Fp8Recipe::mxfp8, 64, 64, 96}),
                         [](const auto& info) { return case_name(info.param); });

// W, x and dy of a linear of in -> out features on N rows: small weights, unit activations and
// small gradients, as a model's.
struct Operands {
  std::vector<float> w, x, dy;
  Operands(int64_t N, int in, int out)
      : w(random_vec(size_t(out) * in, 7, 0.05f)), x(random_vec(size_t(N) * in, 8, 1.0f)),
        dy(random_vec(size_t(N) * out, 9, 1e-3f)) {}
};

// Delayed: each operand's largest magnitude is recorded until taken; new scales repack W.
TEST(LinearFp8, DelayedRecordsAmaxAndRescales) {
  const int64_t N = 8;
  const int in = 16, out = 24;
  auto [w, x, dy] = Operands(N, in, out);
  LinearGemm g(in, out, Precision::fp8);
  g.set_weight(w.data());
  std::vector<float> y1(size_t(N) * out), y2(y1.size()), dx(size_t(N) * in);
  g.forward(y1.data(), x.data(), N, nullptr);
  g.backward_input(dx.data(), dy.data(), N, false);
  const Fp8Triple a = g.take_fp8_amax();
  EXPECT_EQ(a[fp8_x], kernels::abs_max(x.data(), int64_t(x.size())));
  EXPECT_EQ(a[fp8_w], kernels::abs_max(w.data(), int64_t(w.size())));
  EXPECT_EQ(a[fp8_dy], kernels::abs_max(dy.data(), int64_t(dy.size())));
  EXPECT_EQ(g.take_fp8_amax(), (Fp8Triple{0.0f, 0.0f, 0.0f}));
  g.set_fp8_scales({448.0f / a[0], 448.0f / a[1], 57344.0f / a[2]});
  g.forward(y2.data(), x.data(), N, nullptr);
  EXPECT_NE(y1, y2) << "scale 1 and the amax's scale quantise differently";
  const auto xf = dequantised(x, N, in, N, in, Fp8Format::e4m3, 448.0f / a[0]);
  const auto wf = dequantised(w, out, in, out, in, Fp8Format::e4m3, 448.0f / a[1]);
  expect_close(y2, multiply(xf, in, 1, wf, 1, in, N, in, out), {}, "forward after rescale");
}

// Current: the amax is the reducer's answer (here: the local one doubled, as if another rank
// held twice the largest value), so the scale halves.
TEST(LinearFp8, CurrentScalesThroughTheReducer) {
  struct Doubling : AmaxReducer {
    int calls = 0;
    float max(float local) override { return ++calls, 2 * local; }
  } activations, weight;
  const int64_t N = 8;
  const int in = 16, out = 24;
  auto w = random_vec(size_t(out) * in, 7, 0.05f);
  auto x = random_vec(size_t(N) * in, 8, 1.0f);
  LinearGemm g(in, out, Precision::fp8);
  g.set_fp8({Fp8Recipe::current, 0, &activations, &weight});
  g.set_weight(w.data());
  std::vector<float> y(size_t(N) * out);
  g.forward(y.data(), x.data(), N, nullptr);
  EXPECT_EQ(activations.calls, 1);
  EXPECT_EQ(weight.calls, 1);
  const auto xf =
      dequantised(x, N, in, N, in, Fp8Format::e4m3, 224.0f / kernels::abs_max(x.data(), N * in));
  const auto wf = dequantised(w, out, in, out, in, Fp8Format::e4m3,
                              224.0f / kernels::abs_max(w.data(), out * in));
  expect_close(y, multiply(xf, in, 1, wf, 1, in, N, in, out), {}, "forward");
  g.forward(y.data(), x.data(), N, nullptr);
  EXPECT_EQ(weight.calls, 1) << "W's scale is taken once per version";
}

// The planner's count of what these kernels stream (kernels::fp8_traffic), by hand for a linear
// of 3 -> 5 features on 2 rows (x: 6 values, y and dy: 10, W: 15), in bytes: a float read and a
// code written make codes (5 a value), a code read and a bf16 written an image (3), an amax pass
// reads the floats (4).
TEST(LinearFp8, TrafficCountsEachKernelsBytes) {
  using kernels::Fp8LinearUse;
  using kernels::fp8_traffic;
  // Per-tensor: amax + codes + image of each operand, scaled epilogues (8 a value), the weight
  // gradient's images of both kept operands and its scaled sum (12 a weight); W's amax, codes
  // and float image (1 + 4) once per version.
  const kernels::Fp8Traffic d = fp8_traffic(Fp8Recipe::delayed, 2, 3, 5, {});
  EXPECT_DOUBLE_EQ(d.forward, 12 * 6 + 8 * 10);
  EXPECT_DOUBLE_EQ(d.backward_input, 12 * 10 + 8 * 6);
  EXPECT_DOUBLE_EQ(d.backward_weight, 3 * (6 + 10) + 12 * 15);
  EXPECT_DOUBLE_EQ(d.weight_images, 14 * 15);
  EXPECT_DOUBLE_EQ(d.weight_image_one, 14 * 15);
  EXPECT_DOUBLE_EQ(d.x_copy, 9 * 6);
  // dy not kept (a deferred weight gradient) nor x (sequence parallelism): quantised again.
  Fp8LinearUse neither;
  neither.x_kept = neither.dy_kept = false;
  const kernels::Fp8Traffic dn = fp8_traffic(Fp8Recipe::current, 2, 3, 5, neither);
  EXPECT_DOUBLE_EQ(dn.forward, d.forward);
  EXPECT_DOUBLE_EQ(dn.backward_input, d.backward_input);
  EXPECT_DOUBLE_EQ(dn.backward_weight, d.backward_weight + 9 * (6 + 10));
  // W from an FP8 gather brings its amax.
  Fp8LinearUse gathered;
  gathered.gathered_fp8 = true;
  EXPECT_DOUBLE_EQ(fp8_traffic(Fp8Recipe::delayed, 2, 3, 5, gathered).weight_images, 10 * 15);
  // Tiles: codes + image, and codes again kept along the rows; no scaling but the bias; the
  // weight gradient reads the kept codes' images; W's codes and float image, mxfp8 one per
  // product.
  Fp8LinearUse bias;
  bias.bias = true;
  const kernels::Fp8Traffic b = fp8_traffic(Fp8Recipe::blockwise, 2, 3, 5, bias);
  EXPECT_DOUBLE_EQ(b.forward, 13 * 6 + 8 * 10);
  EXPECT_DOUBLE_EQ(b.backward_input, 13 * 10);
  EXPECT_DOUBLE_EQ(b.backward_weight, 3 * (6 + 10));
  EXPECT_DOUBLE_EQ(b.weight_images, 10 * 15);
  neither.images.per_version = 2;
  const kernels::Fp8Traffic m = fp8_traffic(Fp8Recipe::mxfp8, 2, 3, 5, neither);
  EXPECT_DOUBLE_EQ(m.forward, 8 * 6);
  EXPECT_DOUBLE_EQ(m.backward_input, 8 * 10);
  EXPECT_DOUBLE_EQ(m.backward_weight, 3 * (6 + 10) + 5 * (6 + 10));
  EXPECT_DOUBLE_EQ(m.weight_images, 2 * 10 * 15);
  EXPECT_DOUBLE_EQ(m.weight_image_one, 10 * 15);
  // A role whose products read W as it lies: an image at each of its products, one packed copy's
  // per version.
  Fp8LinearUse in_place;
  in_place.images = {1, true, false};
  const kernels::Fp8Traffic p = fp8_traffic(Fp8Recipe::delayed, 2, 3, 5, in_place);
  EXPECT_DOUBLE_EQ(p.forward, d.forward + 14 * 15);
  EXPECT_DOUBLE_EQ(p.backward_input, d.backward_input);
  EXPECT_DOUBLE_EQ(p.weight_images, 14 * 15);
}

// LinearGemm::fp8_images against the products: a second forward or backward_input of the same
// weight version makes W's image again exactly where fp8_images says that role reads W as it
// lies. Seen through the delayed recipe's amax record, which each image of W updates: W doubled
// in place without a new version shows only in an image made anew.
TEST(LinearFp8, ImagesAreMadeWhereFp8ImagesSays) {
  const int64_t N = 16;
  const int in = 64, out = 96;
  auto [w, x, dy] = Operands(N, in, out);
  LinearGemm g(in, out, Precision::fp8);
  uint64_t version = 1;
  g.set_weight(w.data(), &version);
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in);
  const LinearGemm::Fp8Images images = g.fp8_images(N);
  EXPECT_GE(images.per_version + int(images.per_forward) + int(images.per_backward_input), 1);
  g.forward(y.data(), x.data(), N, nullptr);
  g.backward_input(dx.data(), dy.data(), N, false);
  g.take_fp8_amax();
  // W's values doubled in place without a new version: only images made from now on see them.
  for (float& v : w) v *= 2;
  const float doubled = kernels::abs_max(w.data(), int64_t(w.size()));
  g.forward(y.data(), x.data(), N, nullptr);
  EXPECT_EQ(g.take_fp8_amax()[fp8_w] == doubled, images.per_forward)
      << "a forward of the same version remade W's image: " << images.per_forward;
  g.backward_input(dx.data(), dy.data(), N, false);
  EXPECT_EQ(g.take_fp8_amax()[fp8_w] == doubled, images.per_backward_input)
      << "a backward_input of the same version remade W's image: " << images.per_backward_input;
}

}  // namespace
}  // namespace cleave
