// LinearGemm::thread_scratch_bytes, the planner's figure for the per-thread buffers the products
// share, against what a fresh thread's buffers hold after a linear's three products (forward,
// backward_input accumulating, backward_weight, no operand kept): equal, buffer by buffer, in
// every precision and FP8 recipe, for shapes wider and narrower than they are deep, and for two
// linears on one thread (each buffer the larger of their needs). On a CPU with bf16 products the
// second ctest entry runs it again emulated (CLEAVE_EMULATE_BF16=1), as AVX2 CPUs run them.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cleave/kernels/linear.h"

namespace cleave {
namespace {

struct Shape {
  int in, out;
  int64_t N;
};

// The three products of g on N rows of random operands, on the calling thread.
void run_products(LinearGemm& g, const std::vector<float>& w, int64_t N) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& e : v) e = normal(rng);
    return v;
  };
  const int in = g.in_features(), out = g.out_features();
  const std::vector<float> x = random(size_t(N) * in), dy = random(size_t(N) * out);
  std::vector<float> y(size_t(N) * out), dx(size_t(N) * in), dw(w.size()), db(static_cast<size_t>(out));
  g.set_weight(w.data());
  g.forward(y.data(), x.data(), N, nullptr);
  g.backward_input(dx.data(), dy.data(), N, true);
  g.backward_weight(dw.data(), db.data(), dy.data(), x.data(), N);
}

struct Setting {
  Precision precision;
  kernels::Fp8Recipe recipe;
};

std::string name_of(const Setting& s) {
  if (s.precision != Precision::fp8) return precision_name(s.precision);
  static const char* const recipes[] = {"delayed", "current", "blockwise", "mxfp8"};
  return std::string("fp8_") + recipes[int(s.recipe)];
}

class ThreadScratchTest : public ::testing::TestWithParam<Setting> {
 protected:
  LinearGemm make(const Shape& s) const {
    LinearGemm g(s.in, s.out, GetParam().precision);
    if (GetParam().precision == Precision::fp8) {
      Fp8Settings settings;
      settings.recipe = GetParam().recipe;
      g.set_fp8(settings);
      // Delayed scales of 1 (before the first amax is taken) leave a weight gradient unscaled.
      if (GetParam().recipe == kernels::Fp8Recipe::delayed) g.set_fp8_scales({2.0f, 4.0f, 8.0f});
    }
    return g;
  }
};

void expect_equal(const LinearGemm::ThreadScratch& held, const LinearGemm::ThreadScratch& planned,
                  const std::string& what) {
  for (int b = 0; b < LinearGemm::n_thread_buffers; ++b)
    EXPECT_EQ(held.bytes[size_t(b)], planned.bytes[size_t(b)]) << what << ", buffer " << b;
}

TEST_P(ThreadScratchTest, BuffersHoldWhatThePlanSays) {
  for (const Shape s : {Shape{64, 200, 37}, Shape{300, 48, 130}, Shape{96, 96, 1}}) {
    LinearGemm g = make(s);
    const std::vector<float> w(size_t(s.in) * s.out, 0.01f);
    LinearGemm::ThreadScratch held;
    std::thread([&] {
      run_products(g, w, s.N);
      held = LinearGemm::thread_scratch_held();
    }).join();
    const std::string what = std::to_string(s.in) + " -> " + std::to_string(s.out) + " on " +
                             std::to_string(s.N) + " rows";
    expect_equal(held, g.thread_scratch_bytes(s.N), what);
    if (GetParam().precision == Precision::fp32)
      EXPECT_EQ(held.total(), 0) << what << ": fp32 products read their operands in place";
    else
      EXPECT_GT(held.total(), 0) << what;
  }
}

TEST_P(ThreadScratchTest, TwoLinearsTakeTheLargerOfEachBuffer) {
  const Shape a{64, 200, 37}, b{300, 48, 130};
  LinearGemm ga = make(a), gb = make(b);
  const std::vector<float> wa(size_t(a.in) * a.out, 0.01f), wb(size_t(b.in) * b.out, 0.02f);
  LinearGemm::ThreadScratch held;
  std::thread([&] {
    run_products(ga, wa, a.N);
    run_products(gb, wb, b.N);
    held = LinearGemm::thread_scratch_held();
  }).join();
  LinearGemm::ThreadScratch planned = ga.thread_scratch_bytes(a.N);
  planned.at_least(gb.thread_scratch_bytes(b.N));
  expect_equal(held, planned, "two linears");
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, ThreadScratchTest,
    ::testing::Values(Setting{Precision::fp32, kernels::Fp8Recipe::delayed},
                      Setting{Precision::bf16, kernels::Fp8Recipe::delayed},
                      Setting{Precision::fp16, kernels::Fp8Recipe::delayed},
                      Setting{Precision::fp8, kernels::Fp8Recipe::delayed},
                      Setting{Precision::fp8, kernels::Fp8Recipe::current},
                      Setting{Precision::fp8, kernels::Fp8Recipe::blockwise},
                      Setting{Precision::fp8, kernels::Fp8Recipe::mxfp8}),
    [](const auto& info) { return name_of(info.param); });

}  // namespace
}  // namespace cleave
