// LinearGemm against a naive double-precision reference, in fp32 and bf16.
#include "cleave/kernels/linear.h"
#include "cleave/kernels/weight_pack.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/kernels/convert.h"
#include "cleave/kernels/gemm_bench.h"

namespace cleave {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (auto& e : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = scale * (float((s >> 40) & 0xFFFFFF) / 16777216.f * 2.f - 1.f);
  }
  return v;
}

// The values an operand takes in bf16 mode (round to nearest even).
std::vector<float> bf16_rounded(const std::vector<float>& v) {
  std::vector<kernels::bf16> b(v.size());
  std::vector<float> r(v.size());
  kernels::f32_to_bf16(b.data(), v.data(), int64_t(v.size()));
  kernels::bf16_to_f32(r.data(), b.data(), int64_t(v.size()));
  return r;
}

// C[M,Nc] = sum_k A(m,k) B(k,n), with |.| sums for the error bound, in double.
struct Ref {
  std::vector<double> val, mag;
};

Ref ref_forward(const std::vector<float>& x, const std::vector<float>& w, const float* bias,
                int64_t N, int in, int out) {
  Ref r{std::vector<double>(N * out), std::vector<double>(N * out)};
  for (int64_t n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double s = bias ? bias[o] : 0.0, m = bias ? std::fabs(bias[o]) : 0.0;
      for (int i = 0; i < in; ++i) {
        double t = double(x[n * in + i]) * w[size_t(o) * in + i];
        s += t;
        m += std::fabs(t);
      }
      r.val[n * out + o] = s;
      r.mag[n * out + o] = m;
    }
  return r;
}

Ref ref_backward_input(const std::vector<float>& dy, const std::vector<float>& w, int64_t N,
                       int in, int out) {
  Ref r{std::vector<double>(N * in), std::vector<double>(N * in)};
  for (int64_t n = 0; n < N; ++n)
    for (int i = 0; i < in; ++i) {
      double s = 0, m = 0;
      for (int o = 0; o < out; ++o) {
        double t = double(dy[n * out + o]) * w[size_t(o) * in + i];
        s += t;
        m += std::fabs(t);
      }
      r.val[n * in + i] = s;
      r.mag[n * in + i] = m;
    }
  return r;
}

Ref ref_backward_weight(const std::vector<float>& dy, const std::vector<float>& x, int64_t N,
                        int in, int out) {
  Ref r{std::vector<double>(size_t(out) * in), std::vector<double>(size_t(out) * in)};
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      double s = 0, m = 0;
      for (int64_t n = 0; n < N; ++n) {
        double t = double(dy[n * out + o]) * x[n * in + i];
        s += t;
        m += std::fabs(t);
      }
      r.val[size_t(o) * in + i] = s;
      r.mag[size_t(o) * in + i] = m;
    }
  return r;
}

// got[i] == base[i] + ref.val[i] within rel * (|base[i]| + ref.mag[i]) + 1e-30.
void expect_close(const std::vector<float>& got, const Ref& ref, double rel,
                  const std::vector<float>* base = nullptr, const char* what = "") {
  ASSERT_EQ(got.size(), ref.val.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double b = base ? (*base)[i] : 0.0;
    double want = b + ref.val[i];
    double tol = rel * (std::fabs(b) + ref.mag[i]) + 1e-30;
    if (!(std::fabs(double(got[i]) - want) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "] got " << got[i] << " want " << want << " tol "
                    << tol;
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Shape {
  int64_t N;
  int in, out;
};

std::string shape_name(const Shape& s) {
  std::ostringstream os;
  os << "N" << s.N << "_in" << s.in << "_out" << s.out;
  return os.str();
}

class LinearTest : public ::testing::TestWithParam<std::tuple<Shape, Precision>> {};

TEST_P(LinearTest, MatchesReference) {
  auto [shape, precision] = GetParam();
  const auto [N, in, out] = shape;
  const bool bf = precision == Precision::bf16;
  const double rel = bf ? 1e-2 : 1e-5;

  auto w = random_vec(size_t(out) * in, 1, 0.5f);
  auto x = random_vec(size_t(N) * in, 2);
  auto dy = random_vec(size_t(N) * out, 3, 0.1f);
  auto bias = random_vec(out, 4);

  LinearGemm g(in, out, precision);
  EXPECT_EQ(g.in_features(), in);
  EXPECT_EQ(g.out_features(), out);
  g.set_weight(w.data());

  // forward without and with bias
  std::vector<float> y(size_t(N) * out, 123.f);
  g.forward(y.data(), x.data(), N, nullptr);
  expect_close(y, ref_forward(x, w, nullptr, N, in, out), rel, nullptr, "forward");
  g.forward(y.data(), x.data(), N, bias.data());
  expect_close(y, ref_forward(x, w, bias.data(), N, in, out), rel, nullptr, "forward+bias");

  // backward_input, = then +=
  auto dx0 = random_vec(size_t(N) * in, 5);
  std::vector<float> dx = dx0;
  g.backward_input(dx.data(), dy.data(), N, false);
  auto rdx = ref_backward_input(dy, w, N, in, out);
  expect_close(dx, rdx, rel, nullptr, "backward_input =");
  dx = dx0;
  g.backward_input(dx.data(), dy.data(), N, true);
  expect_close(dx, rdx, rel, &dx0, "backward_input +=");

  // backward_weight accumulates into dW and dbias
  auto dw0 = random_vec(size_t(out) * in, 6);
  auto db0 = random_vec(out, 7);
  std::vector<float> dw = dw0, db = db0;
  g.backward_weight(dw.data(), db.data(), dy.data(), x.data(), N);
  expect_close(dw, ref_backward_weight(dy, x, N, in, out), rel, &dw0, "backward_weight");
  Ref rdb{std::vector<double>(out, 0.0), std::vector<double>(out, 0.0)};
  for (int64_t n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      rdb.val[o] += dy[n * out + o];
      rdb.mag[o] += std::fabs(dy[n * out + o]);
    }
  expect_close(db, rdb, 1e-6, &db0, "dbias");  // dbias is summed in fp32 input precision

  // null dbias leaves nothing else touched
  dw = dw0;
  g.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N);
  expect_close(dw, ref_backward_weight(dy, x, N, in, out), rel, &dw0, "backward_weight nobias");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearTest,
    ::testing::Combine(::testing::Values(Shape{7, 13, 5}, Shape{64, 96, 160}, Shape{1, 1, 1},
                                         Shape{33, 200, 17}),
                       ::testing::Values(Precision::fp32, Precision::bf16)),
    [](const auto& info) {
      const bool bf = std::get<1>(info.param) == Precision::bf16;
      return shape_name(std::get<0>(info.param)) + (bf ? "_bf16" : "_fp32");
    });

// g's three products on x and dy (its weight set) are exact fp32 accumulations of the rounded
// operands wr, xr and dyr.
void expect_rounded_products(LinearGemm& g, const std::vector<float>& x,
                             const std::vector<float>& dy, const std::vector<float>& wr,
                             const std::vector<float>& xr, const std::vector<float>& dyr, int64_t N,
                             int64_t in, int64_t out) {
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
  g.forward(y.data(), x.data(), N, nullptr);
  g.backward_input(dx.data(), dy.data(), N, false);
  g.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N);
  expect_close(y, ref_forward(xr, wr, nullptr, N, in, out), 1e-5, nullptr, "forward");
  expect_close(dx, ref_backward_input(dyr, wr, N, in, out), 1e-5, nullptr, "backward_input");
  expect_close(dw, ref_backward_weight(dyr, xr, N, in, out), 1e-5, nullptr, "backward_weight");
}

// In bf16 mode the products must be exact fp32 accumulations of the bf16-rounded operands.
class LinearBf16Test : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearBf16Test, AccumulatesInFp32) {
  const auto [N, in, out] = GetParam();
  const Precision precision = Precision::bf16;
  auto w = random_vec(size_t(out) * in, 11, 0.5f);
  auto x = random_vec(size_t(N) * in, 12);
  auto dy = random_vec(size_t(N) * out, 13, 0.1f);
  auto wr = bf16_rounded(w), xr = bf16_rounded(x), dyr = bf16_rounded(dy);

  LinearGemm g(in, out, precision);
  g.set_weight(w.data());
  expect_rounded_products(g, x, dy, wr, xr, dyr, N, in, out);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearBf16Test,
                         ::testing::Values(Shape{7, 13, 5}, Shape{64, 96, 160}, Shape{33, 200, 17}),
                         [](const auto& info) { return shape_name(info.param); });

// fp16 mode: exact fp32 accumulations of the fp16-rounded operands, the weight's rounding
// renewed when the weight changes.
TEST(LinearFp16Test, AccumulatesFp16RoundedOperandsInFp32) {
  const int64_t N = 33, in = 200, out = 17;
  auto w = random_vec(size_t(out) * in, 11, 0.5f);
  auto x = random_vec(size_t(N) * in, 12);
  auto dy = random_vec(size_t(N) * out, 13, 0.1f);
  auto rounded = [](std::vector<float> v) {
    kernels::round_to_fp16(v.data(), v.data(), int64_t(v.size()));
    return v;
  };
  auto xr = rounded(x), dyr = rounded(dy);
  LinearGemm g(in, out, Precision::fp16);
  g.set_weight(w.data());
  for (int version = 0; version < 2; ++version) {
    auto wr = rounded(w);
    expect_rounded_products(g, x, dy, wr, xr, dyr, N, in, out);
    EXPECT_NE(wr, w) << "the weight must hold values fp16 rounds";
    for (float& v : w) v *= 1.37f;
    g.set_weight(w.data());
  }
}

class LinearPrecisionTest : public ::testing::TestWithParam<Precision> {};

TEST_P(LinearPrecisionTest, SetWeightInvalidatesPackedWeights) {
  const Precision p = GetParam();
  const double rel = p == Precision::bf16 ? 1e-2 : 1e-5;
  const int64_t N = 20;
  const int in = 48, out = 40;
  auto w = random_vec(size_t(out) * in, 21, 0.5f);
  auto x = random_vec(size_t(N) * in, 22);
  auto dy = random_vec(size_t(N) * out, 23);
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in);
  g.forward(y.data(), x.data(), N, nullptr);
  g.backward_input(dx.data(), dy.data(), N, false);

  // Same buffer, new values (as an optimizer step does), then set_weight.
  auto w2 = random_vec(size_t(out) * in, 24, 0.5f);
  std::memcpy(w.data(), w2.data(), w.size() * sizeof(float));
  g.set_weight(w.data());
  g.forward(y.data(), x.data(), N, nullptr);
  expect_close(y, ref_forward(x, w2, nullptr, N, in, out), rel, nullptr,
               "forward after set_weight");
  g.backward_input(dx.data(), dy.data(), N, false);
  expect_close(dx, ref_backward_input(dy, w2, N, in, out), rel, nullptr,
               "backward_input after set_weight");

  // A different buffer.
  auto w3 = random_vec(size_t(out) * in, 25, 0.5f);
  g.set_weight(w3.data());
  g.backward_input(dx.data(), dy.data(), N, false);
  expect_close(dx, ref_backward_input(dy, w3, N, in, out), rel, nullptr,
               "backward_input after set_weight (new buffer)");
  g.forward(y.data(), x.data(), N, nullptr);
  expect_close(y, ref_forward(x, w3, nullptr, N, in, out), rel, nullptr,
               "forward after set_weight (new buffer)");
}

// An optimizer packing W band by band as it writes W (in any order, from several threads) leaves
// the same products, bit for bit, as packing at the next product; shapes with and without
// padding rows, and a layer packed by bands that gives up no band.
TEST_P(LinearPrecisionTest, RowPackingMatchesPackingAtTheNextProduct) {
  const Precision p = GetParam();
  const int64_t N = 64;
  for (auto [in, out] : {std::pair<int, int>{128, 256}, {72, 200}}) {
    auto w = random_vec(size_t(out) * in, 31, 0.5f);
    auto x = random_vec(size_t(N) * in, 32);
    auto dy = random_vec(size_t(N) * out, 33);
    LinearGemm lazy(in, out, p), rows(in, out, p);
    std::vector<float> y(size_t(N) * out), dx(size_t(N) * in);
    for (LinearGemm* g : {&lazy, &rows}) {
      g->set_weight(w.data());
      g->forward(y.data(), x.data(), N, nullptr);  // creates both packed copies
      g->backward_input(dx.data(), dy.data(), N, false);
    }
    auto w2 = random_vec(size_t(out) * in, 34, 0.5f);
    std::memcpy(w.data(), w2.data(), w.size() * sizeof(float));
    lazy.set_weight(w.data());
    rows.set_weight(w.data());
    if (!kernels::packer_writes_layouts(N, in, out, p == Precision::bf16))
      GTEST_SKIP() << "oneDNN reads this CPU's weights in no layout cleave's packer writes";
    if (p == Precision::bf16 && !native_bf16_products())
      GTEST_SKIP() << "emulated bf16 packs from the weight's rounding, at the next product";
    const int64_t band = rows.begin_row_packing();
    ASSERT_GT(band, 0) << in << "x" << out;
    const int64_t bands = (out + band - 1) / band;
#pragma omp parallel for schedule(static, 1)
    for (int64_t b = bands - 1; b >= 0; --b)
      rows.pack_rows(b * band, std::min<int64_t>(out, (b + 1) * band));
    rows.all_rows_packed();
    std::vector<float> y_lazy(y.size()), y_rows(y.size()), dx_lazy(dx.size()), dx_rows(dx.size());
    lazy.forward(y_lazy.data(), x.data(), N, nullptr);
    rows.forward(y_rows.data(), x.data(), N, nullptr);
    lazy.backward_input(dx_lazy.data(), dy.data(), N, false);
    rows.backward_input(dx_rows.data(), dy.data(), N, false);
    EXPECT_EQ(std::memcmp(y_lazy.data(), y_rows.data(), y.size() * 4), 0) << in << "x" << out;
    EXPECT_EQ(std::memcmp(dx_lazy.data(), dx_rows.data(), dx.size() * 4), 0) << in << "x" << out;
  }
}

TEST_P(LinearPrecisionTest, SeveralTokenCountsShareOneLayer) {
  const Precision p = GetParam();
  const double rel = p == Precision::bf16 ? 1e-2 : 1e-5;
  const int in = 24, out = 36;
  auto w = random_vec(size_t(out) * in, 31, 0.5f);
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  for (int64_t N : {7, 64, 7, 130}) {
    auto x = random_vec(size_t(N) * in, 32 + uint32_t(N));
    auto dy = random_vec(size_t(N) * out, 33 + uint32_t(N));
    std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
    g.forward(y.data(), x.data(), N, nullptr);
    g.backward_input(dx.data(), dy.data(), N, false);
    g.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N);
    expect_close(y, ref_forward(x, w, nullptr, N, in, out), rel, nullptr, "forward");
    expect_close(dx, ref_backward_input(dy, w, N, in, out), rel, nullptr, "backward_input");
    expect_close(dw, ref_backward_weight(dy, x, N, in, out), rel, nullptr, "backward_weight");
  }
}

// backward_weight with the bf16 copies its caller kept, and without them (bf16 mode converts the
// operands itself): the same bits. The copies belong to their owner, so another product in
// between (another micro-batch's forward) cannot change what they hold.
TEST_P(LinearPrecisionTest, KeptOperandCopies) {
  const Precision p = GetParam();
  const double rel = p == Precision::bf16 ? 1e-2 : 1e-5;
  const int64_t N = 16;
  const int in = 40, out = 24;
  auto w = random_vec(size_t(out) * in, 41, 0.5f);
  auto x = random_vec(size_t(N) * in, 42);
  auto x2 = random_vec(size_t(N) * in, 43);
  auto dy = random_vec(size_t(N) * out, 44);
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in);
  std::vector<float> kept(size_t(out) * in, 0.f), converted(size_t(out) * in, 0.f);
  OperandCopy x_copy, x2_copy, dy_copy;
  g.forward(y.data(), x.data(), N, nullptr, &x_copy);
  g.forward(y.data(), x2.data(), N, nullptr, &x2_copy);  // a second micro-batch in flight
  g.backward_input(dx.data(), dy.data(), N, false, &dy_copy);
  g.backward_weight(kept.data(), nullptr, dy.data(), x.data(), N, &dy_copy, &x_copy);
  g.backward_weight(converted.data(), nullptr, dy.data(), x.data(), N);
  expect_close(kept, ref_backward_weight(dy, x, N, in, out), rel, nullptr, "kept copies");
  EXPECT_EQ(0, std::memcmp(kept.data(), converted.data(), kept.size() * sizeof(float)));
  if (p == Precision::bf16) {
    // A copy of another size is an error, never a silent product of the wrong operand.
    OperandCopy short_copy;
    g.forward(y.data(), x.data(), N / 2, nullptr, &short_copy);
    EXPECT_THROW(g.backward_weight(kept.data(), nullptr, dy.data(), x.data(), N, nullptr,
                                   &short_copy),
                 cleave::Error);
  }
}

// A product from an operand copy its producer wrote (bf16 mode: an activation or its gradient
// written straight to bf16) gives the bits of the product that converts the same values itself;
// a copy of another size, or another mode, is refused.
TEST_P(LinearPrecisionTest, ProductsFromCopiesMatchProductsThatConvert) {
  const Precision p = GetParam();
  const int64_t N = 24;
  const int in = 40, out = 56;
  auto w = random_vec(size_t(out) * in, 45, 0.5f);
  auto x = random_vec(size_t(N) * in, 46);
  auto bias = random_vec(size_t(out), 47);
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  std::vector<float> y(size_t(N) * out), from_copy(size_t(N) * out);
  OperandCopy copy;
  g.forward(y.data(), x.data(), N, bias.data(), &copy);
  if (p != Precision::bf16) {
    EXPECT_THROW(g.forward_from_copy(from_copy.data(), copy, N, bias.data()), cleave::Error);
    return;
  }
  OperandCopy made;  // as a producer writes it: x's values rounded to bf16
  g.copy_operand(x.data(), N * in, made);
  g.forward_from_copy(from_copy.data(), made, N, bias.data());
  EXPECT_EQ(0, std::memcmp(y.data(), from_copy.data(), y.size() * sizeof(float)));
  EXPECT_THROW(g.forward_from_copy(from_copy.data(), made, N / 2, bias.data()), cleave::Error);

  // backward_input likewise, writing and accumulating.
  auto dy = random_vec(size_t(N) * out, 48);
  OperandCopy dy_made;
  g.copy_operand(dy.data(), N * out, dy_made);
  for (bool accumulate : {false, true}) {
    std::vector<float> dx(size_t(N) * in, 0.5f), dx_from_copy(size_t(N) * in, 0.5f);
    g.backward_input(dx.data(), dy.data(), N, accumulate);
    g.backward_input_from_copy(dx_from_copy.data(), dy_made, N, accumulate);
    EXPECT_EQ(0, std::memcmp(dx.data(), dx_from_copy.data(), dx.size() * sizeof(float)))
        << "accumulate " << accumulate;
  }
  EXPECT_THROW(g.backward_input_from_copy(from_copy.data(), made, N, false), cleave::Error);
}

TEST_P(LinearPrecisionTest, BitwiseDeterministic) {
  const Precision p = GetParam();
  const int64_t N = 256;
  const int in = 384, out = 320;
  auto w = random_vec(size_t(out) * in, 51, 0.1f);
  auto x = random_vec(size_t(N) * in, 52);
  auto dy = random_vec(size_t(N) * out, 53);
  auto bias = random_vec(out, 54);
  auto run = [&](LinearGemm& g, std::vector<float>& y, std::vector<float>& dx,
                 std::vector<float>& dw, std::vector<float>& db) {
    y.assign(size_t(N) * out, 0.f);
    dx.assign(size_t(N) * in, 0.f);
    dw.assign(size_t(out) * in, 0.f);
    db.assign(out, 0.f);
    g.forward(y.data(), x.data(), N, bias.data());
    g.backward_input(dx.data(), dy.data(), N, true);
    g.backward_weight(dw.data(), db.data(), dy.data(), x.data(), N);
  };
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  std::vector<float> y1, dx1, dw1, db1, y2, dx2, dw2, db2;
  run(g, y1, dx1, dw1, db1);
  run(g, y2, dx2, dw2, db2);
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * 4));
  EXPECT_EQ(0, std::memcmp(dw1.data(), dw2.data(), dw1.size() * 4));
  EXPECT_EQ(0, std::memcmp(db1.data(), db2.data(), db1.size() * 4));

  // A second layer object (fresh primitives and packing) gives the same bits.
  LinearGemm g2(in, out, p);
  g2.set_weight(w.data());
  run(g2, y2, dx2, dw2, db2);
  EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4));
  EXPECT_EQ(0, std::memcmp(dx1.data(), dx2.data(), dx1.size() * 4));
  EXPECT_EQ(0, std::memcmp(dw1.data(), dw2.data(), dw1.size() * 4));
  EXPECT_EQ(0, std::memcmp(db1.data(), db2.data(), db1.size() * 4));
}

// A layer of random weights with a random input and output gradient over N rows.
struct RandomLayer {
  std::vector<float> w, x, dy;
  LinearGemm g;
  RandomLayer(int64_t N, int in, int out, Precision p, uint32_t seed)
      : w(random_vec(size_t(out) * in, seed)), x(random_vec(size_t(N) * in, seed + 1)),
        dy(random_vec(size_t(N) * out, seed + 2)), g(in, out, p) {
    g.set_weight(w.data());
  }
};

TEST_P(LinearPrecisionTest, BiasGradientIndependentOfThreadCount) {
  const int64_t N = 300;
  const int in = 8, out = 200;
  RandomLayer layer(N, in, out, GetParam(), 61);
  auto& [w, x, dy, g] = layer;
  std::vector<float> dw(size_t(out) * in, 0.f), db1(out, 0.f), db2(out, 0.f);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  g.backward_weight(dw.data(), db1.data(), dy.data(), x.data(), N);
  omp_set_num_threads(std::max(2, saved));
  g.backward_weight(dw.data(), db2.data(), dy.data(), x.data(), N);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(db1.data(), db2.data(), db1.size() * 4));
}

// A copy of dy whose producer summed the bias (bias_summed) makes backward_weight leave the bias
// alone and compute the same weight gradient; refilling the copy clears the mark.
TEST_P(LinearPrecisionTest, BiasLeftAloneWhereTheCopyOfDyHasSummedIt) {
  const Precision p = GetParam();
  const int64_t N = 30;
  const int in = 40, out = 70;
  RandomLayer layer(N, in, out, p, 71);
  auto& [w, x, dy, g] = layer;
  OperandCopy dyc;
  std::vector<float> dx(size_t(N) * in);
  g.backward_input(dx.data(), dy.data(), N, false, &dyc);
  std::vector<float> dw(size_t(out) * in, 0.f), db(out, 0.f), dw_marked(dw), db_marked(out, 1.5f);
  g.backward_weight(dw.data(), db.data(), dy.data(), x.data(), N, &dyc);
  dyc.bias_summed = true;
  g.backward_weight(dw_marked.data(), db_marked.data(), dy.data(), x.data(), N, &dyc);
  EXPECT_EQ(0, std::memcmp(dw.data(), dw_marked.data(), dw.size() * 4));
  EXPECT_EQ(db_marked, std::vector<float>(out, 1.5f));
  EXPECT_NE(db, std::vector<float>(out, 0.f));
  if (p != Precision::bf16) return;  // only bf16 products fill the copy
  g.backward_input(dx.data(), dy.data(), N, false, &dyc);
  EXPECT_FALSE(dyc.bias_summed) << "refilling the copy clears the mark";
}

// ZeRO-3 releases a unit's packed copies with its values (release_packed), and their storage
// serves the next products' copies of the same size, holding the old copies' bytes: a layer
// packed into it computes bit for bit what a layer packing into fresh memory does, padding
// included (shapes that are no multiple of the blocks), and the released layer repacks.
TEST_P(LinearPrecisionTest, ReleasedCopiesServeTheNextLayerBitForBit) {
  const Precision p = GetParam();
  const int64_t N = 64;
  const int in = 200, out = 130;
  auto wa = random_vec(size_t(out) * in, 81, 0.5f), wb = random_vec(size_t(out) * in, 82, 0.5f);
  auto x = random_vec(size_t(N) * in, 83);
  auto dy = random_vec(size_t(N) * out, 84);
  auto run = [&](LinearGemm& g, std::vector<float>& y, std::vector<float>& dx) {
    y.assign(size_t(N) * out, 0.f);
    dx.assign(size_t(N) * in, 0.f);
    g.forward(y.data(), x.data(), N, nullptr);
    g.backward_input(dx.data(), dy.data(), N, false);
  };
  std::vector<float> y_fresh, dx_fresh, y_a, dx_a, y, dx;
  {
    LinearGemm fresh(in, out, p);
    fresh.set_weight(wb.data());
    run(fresh, y_fresh, dx_fresh);
  }
  // Right, not only alike: copies that were never packed would agree with each other.
  const double rel = p == Precision::bf16 ? 1e-2 : 1e-5;
  expect_close(y_fresh, ref_forward(x, wb, nullptr, N, in, out), rel, nullptr, "forward");
  expect_close(dx_fresh, ref_backward_input(dy, wb, N, in, out), rel, nullptr, "backward_input");
  LinearGemm a(in, out, p), b(in, out, p);
  a.set_weight(wa.data());
  b.set_weight(wb.data());
  run(a, y_a, dx_a);
  expect_close(y_a, ref_forward(x, wa, nullptr, N, in, out), rel, nullptr, "forward, a");
  a.release_packed();
  run(b, y, dx);
  EXPECT_EQ(0, std::memcmp(y.data(), y_fresh.data(), y.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx.data(), dx_fresh.data(), dx.size() * sizeof(float)));
  b.release_packed();
  run(a, y, dx);
  EXPECT_EQ(0, std::memcmp(y.data(), y_a.data(), y.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dx.data(), dx_a.data(), dx.size() * sizeof(float)));
}

TEST_P(LinearPrecisionTest, MoveKeepsState) {
  const Precision p = GetParam();
  const double rel = p == Precision::bf16 ? 1e-2 : 1e-5;
  const int64_t N = 5;
  const int in = 12, out = 9;
  auto w = random_vec(size_t(out) * in, 71);
  auto x = random_vec(size_t(N) * in, 72);
  LinearGemm a(in, out, p);
  a.set_weight(w.data());
  std::vector<float> y(size_t(N) * out);
  a.forward(y.data(), x.data(), N, nullptr);
  LinearGemm b(std::move(a));
  std::fill(y.begin(), y.end(), 0.f);
  b.forward(y.data(), x.data(), N, nullptr);
  expect_close(y, ref_forward(x, w, nullptr, N, in, out), rel, nullptr, "moved");
  LinearGemm c(1, 1, p);
  c = std::move(b);
  EXPECT_EQ(c.in_features(), in);
  EXPECT_EQ(c.out_features(), out);
}

// Row-invariant products (inference) give a row the same bits at any row count, with a bias and
// without, on shapes where AMX's per-row-count primitives do not (K = 3,072: K blocked by the row
// count; 1-2 rows on AVX-512 BF16), and the products stay the product.
TEST_P(LinearPrecisionTest, RowInvariantProductsDoNotDependOnTheRowCount) {
  const Precision p = GetParam();
  const int in = 3072, out = 48;
  const int64_t most = 70;
  {
    // GPT-2 124M's second MLP product at up to 128 rows: AMX's primitive for 96 or 128 rows
    // blocks K otherwise than its 16-row tiles', so those counts run tile by tile here.
    const int wide = 768;
    auto w = random_vec(size_t(wide) * in, 84, 0.05f);
    auto x = random_vec(size_t(128) * in, 85);
    LinearGemm g(in, wide, p);
    g.set_weight(w.data());
    g.set_row_invariant(true);
    std::vector<float> tile(size_t(16) * wide);
    g.forward(tile.data(), x.data(), 16, nullptr);
    for (int64_t N : {int64_t(32), int64_t(96), int64_t(128)}) {
      std::vector<float> y(size_t(N) * wide);
      g.forward(y.data(), x.data(), N, nullptr);
      EXPECT_EQ(0, std::memcmp(tile.data(), y.data(), tile.size() * sizeof(float))) << N << " rows";
    }
  }
  auto w = random_vec(size_t(out) * in, 81, 0.05f);
  auto x = random_vec(size_t(most) * in, 82);
  auto bias = random_vec(size_t(out), 83);
  LinearGemm g(in, out, p);
  g.set_weight(w.data());
  g.set_row_invariant(true);
  for (const float* b : std::vector<const float*>{nullptr, bias.data()}) {
    // Every row of every count gets the bits it gets among 70 (in whichever tile it falls, and
    // whether the tiles run as one product or one by one).
    std::vector<float> all(size_t(most) * out);
    g.forward(all.data(), x.data(), most, b);
    expect_close(all, ref_forward(x, w, b, most, in, out), p == Precision::bf16 ? 1e-2 : 1e-5,
                 nullptr, "row-invariant products of 70 rows");
    for (int64_t N : {int64_t(1), int64_t(2), int64_t(5), int64_t(16), int64_t(17), int64_t(33),
                      int64_t(48), most}) {
      std::vector<float> y(size_t(N) * out);
      g.forward(y.data(), x.data(), N, b);
      for (int64_t r = 0; r < N; ++r)
        ASSERT_EQ(0, std::memcmp(&all[size_t(r * out)], &y[size_t(r * out)], size_t(out) * sizeof(float)))
            << "row " << r << " of " << N << " rows, bias " << (b != nullptr);
    }
  }
  g.set_row_invariant(false);
  std::vector<float> y(size_t(most) * out);
  g.forward(y.data(), x.data(), most, nullptr);
  expect_close(y, ref_forward(x, w, nullptr, most, in, out), p == Precision::bf16 ? 1e-2 : 1e-5,
               nullptr, "per-row-count products again");
}

INSTANTIATE_TEST_SUITE_P(Precisions, LinearPrecisionTest,
                         ::testing::Values(Precision::fp32, Precision::bf16),
                         [](const auto& info) {
                           return info.param == Precision::bf16 ? "bf16" : "fp32";
                         });

TEST(LinearBench, RunsOnSmallShapes) {
  auto r = bench_linear_shapes({{16, 32, 48}, {8, 64, 16}}, Precision::fp32, 0.03);
  ASSERT_EQ(r.size(), 6u);
  for (const auto& e : r) {
    EXPECT_GT(e.gflops, 0.0);
    EXPECT_GE(e.repetitions, 3);
  }
  EXPECT_EQ(r[0].pass, "fwd");
  EXPECT_EQ(r[1].pass, "bwd_input");
  EXPECT_EQ(r[2].pass, "bwd_weight");
  double overall = overall_gflops(r);
  EXPECT_GT(overall, 0.0);
  EXPECT_EQ(gpt2_small_linear_shapes().size(), 5u);
}

}  // namespace
}  // namespace cleave
