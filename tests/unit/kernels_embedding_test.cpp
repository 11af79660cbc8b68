// Token + position embedding: forward against a reference, backward against central finite
// differences of sum(dout * out) and an in-order reference scatter, += semantics, repeated tokens,
// thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/embedding.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

}  // namespace

TEST(Embedding, ForwardWithAndWithoutPositions) {
  const int64_t B = 2, T = 5, maxT = 12, off = 4;
  const int V = 9, C = 7;
  const auto wte = randn(V * C, 1), wpe = randn(maxT * C, 2);
  const auto tok = random_ids(B * T, V, 3);
  std::vector<float> out(B * T * C), out_nopos(B * T * C);
  k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, off);
  k::embedding_forward(out_nopos.data(), tok.data(), wte.data(), nullptr, B, T, C, off);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        const int64_t r = b * T + t;
        ASSERT_EQ(out[r * C + c], wte[tok[r] * C + c] + wpe[(off + t) * C + c]);
        ASSERT_EQ(out_nopos[r * C + c], wte[tok[r] * C + c]);
      }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5;
  const int V = 6, C = 7;
  const auto tok = random_ids(B * T, V, 4);  // 10 tokens over 6 ids: repeats are certain
  const auto dout = randn(B * T * C, 5);
  std::vector<double> wte(V * C), wpe(T * C);
  for (size_t i = 0; i < wte.size(); i++) wte[i] = 0.1 * i;
  for (size_t i = 0; i < wpe.size(); i++) wpe[i] = -0.05 * i;
  auto loss = [&] {
    double l = 0;
    for (int64_t r = 0; r < B * T; r++)
      for (int c = 0; c < C; c++)
        l += dout[r * C + c] * (wte[tok[r] * C + c] + wpe[(r % T) * C + c]);
    return l;
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  auto check = [&](std::vector<double>& p, const std::vector<float>& g, const char* what) {
    for (size_t i = 0; i < p.size(); i++) {
      const double h = 1e-4, p0 = p[i];
      p[i] = p0 + h;
      const double lp = loss();
      p[i] = p0 - h;
      const double lm = loss();
      p[i] = p0;
      ASSERT_NEAR(g[i], (lp - lm) / (2 * h), 1e-5) << what << " " << i;
    }
  };
  check(wte, dwte, "dwte");
  check(wpe, dwpe, "dwpe");
}

TEST(Embedding, BackwardAccumulatesInTokenOrder) {
  const int64_t B = 3, T = 50;
  const int V = 11, C = 200;  // several channel blocks
  const auto tok = random_ids(B * T, V, 6);
  const auto dout = randn(B * T * C, 7);
  const auto dwte0 = randn(V * C, 8), dwpe0 = randn(T * C, 9);
  // Reference: the sequential loop the kernel promises to reproduce exactly.
  auto want_te = dwte0, want_pe = dwpe0;
  for (int64_t r = 0; r < B * T; r++)
    for (int c = 0; c < C; c++) want_te[tok[r] * C + c] += dout[r * C + c];
  for (int64_t t = 0; t < T; t++)
    for (int64_t b = 0; b < B; b++)
      for (int c = 0; c < C; c++) want_pe[t * C + c] += dout[(b * T + t) * C + c];
  for (int threads : {1, 3}) {
    Threads th(threads);
    auto dwte = dwte0, dwpe = dwpe0;
    k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    EXPECT_TRUE(bitwise_equal(dwte, want_te)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(dwpe, want_pe)) << threads << " threads";
    auto dwte2 = dwte0;
    k::embedding_backward(dwte2.data(), nullptr, dout.data(), tok.data(), B, T, C);
    EXPECT_TRUE(bitwise_equal(dwte2, want_te)) << "dwpe = null, " << threads << " threads";
  }
}

TEST(Embedding, ForwardIndependentOfThreadCount) {
  const int64_t B = 4, T = 33;
  const int V = 50, C = 96;
  const auto wte = randn(V * C, 10), wpe = randn(64 * C, 11);
  const auto tok = random_ids(B * T, V, 12);
  auto run = [&](int threads) {
    Threads th(threads);
    std::vector<float> out(B * T * C);
    k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 3);
    return out;
  };
  EXPECT_TRUE(bitwise_equal(run(1), run(3)));
}

TEST(Embedding, RejectsBadInputs) {
  std::vector<float> buf(256, 0.0f);
  float* p = buf.data();
  std::vector<int32_t> tok = {0, 1, -3, 2};
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, 1, 4, 8, 0), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), 1, 4, 8), cleave::Error);
  tok = {0, 1, 2, 3};
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, 1, 4, 0, 0), cleave::Error);
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, 1, 4, 8, -1), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), -1, 4, 8), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), 1, 4, -8), cleave::Error);
}
