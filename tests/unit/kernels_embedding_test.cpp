// Token + position embedding: forward against a reference, backward against central finite
// differences of sum(dout * out) and an in-order reference scatter, += semantics, repeated tokens
// and positions, positions other than 0..T-1 (restarting documents, zigzag pieces), thread-count
// independence, out-of-range positions.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/embedding.h"

#include "test_util.h"

namespace k = cleave::kernels;

namespace {

using namespace cleave::test_util;

// The sequential scatter the kernels promise to reproduce exactly.
void ref_scatter(std::vector<float>& table, const std::vector<float>& dout,
                 const std::vector<int32_t>& rows, int C) {
  for (size_t r = 0; r < rows.size(); r++)
    for (int c = 0; c < C; c++) table[rows[r] * C + c] += dout[r * C + c];
}

}  // namespace

TEST(Embedding, ForwardWithAndWithoutPositions) {
  const int64_t B = 2, T = 5, maxT = 12, off = 4;
  const int V = 9, C = 7;
  const auto wte = randn(V * C, 1), wpe = randn(maxT * C, 2);
  const auto tok = random_ids(B * T, V, 3);
  const auto pos = sequence_positions(B, T, off);
  std::vector<float> out(B * T * C), out_nopos(B * T * C);
  k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), pos.data(), B * T, C, maxT);
  k::embedding_forward(out_nopos.data(), tok.data(), wte.data(), nullptr, nullptr, B * T, C, 0);
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int c = 0; c < C; c++) {
        const int64_t r = b * T + t;
        ASSERT_EQ(out[r * C + c], wte[tok[r] * C + c] + wpe[(off + t) * C + c]);
        ASSERT_EQ(out_nopos[r * C + c], wte[tok[r] * C + c]);
      }
}

TEST(Embedding, ForwardTakesEachRowsPosition) {
  const auto pos = restart_and_zigzag_positions();
  const int64_t N = int64_t(pos.size()), maxT = 32;
  const int V = 13, C = 9;
  const auto wte = randn(V * C, 20), wpe = randn(maxT * C, 21);
  const auto tok = random_ids(N, V, 22);
  std::vector<float> out(N * C);
  k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), pos.data(), N, C, maxT);
  for (int64_t r = 0; r < N; r++)
    for (int c = 0; c < C; c++)
      ASSERT_EQ(out[r * C + c], wte[tok[r] * C + c] + wpe[pos[r] * C + c]) << r << "," << c;
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5;
  const int V = 6, C = 7;
  const auto tok = random_ids(B * T, V, 4);  // 10 tokens over 6 ids: repeats are certain
  const auto pos = sequence_positions(B, T);
  const auto dout = randn(B * T * C, 5);
  std::vector<double> wte(V * C), wpe(T * C);
  for (size_t i = 0; i < wte.size(); i++) wte[i] = 0.1 * i;
  for (size_t i = 0; i < wpe.size(); i++) wpe[i] = -0.05 * i;
  auto loss = [&] {
    double l = 0;
    for (int64_t r = 0; r < B * T; r++)
      for (int c = 0; c < C; c++)
        l += dout[r * C + c] * (wte[tok[r] * C + c] + wpe[pos[r] * C + c]);
    return l;
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), pos.data(), B * T, C);
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
  const auto pos = sequence_positions(B, T);
  const auto dout = randn(B * T * C, 7);
  const auto dwte0 = randn(V * C, 8), dwpe0 = randn(T * C, 9);
  // The per-position sum over b in order, as dwpe was summed before positions were per row.
  auto want_te = dwte0, want_pe = dwpe0;
  ref_scatter(want_te, dout, tok, C);
  for (int64_t t = 0; t < T; t++)
    for (int64_t b = 0; b < B; b++)
      for (int c = 0; c < C; c++) want_pe[t * C + c] += dout[(b * T + t) * C + c];
  for (int threads : {1, 3}) {
    Threads th(threads);
    auto dwte = dwte0, dwpe = dwpe0;
    k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), pos.data(), B * T, C);
    EXPECT_TRUE(bitwise_equal(dwte, want_te)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(dwpe, want_pe)) << threads << " threads";
    auto dwte2 = dwte0;
    k::embedding_backward(dwte2.data(), nullptr, dout.data(), tok.data(), nullptr, B * T, C);
    EXPECT_TRUE(bitwise_equal(dwte2, want_te)) << "dwpe = null, " << threads << " threads";
  }
}

TEST(Embedding, BackwardAccumulatesEveryRowOfARepeatedPosition) {
  const auto pos = restart_and_zigzag_positions();  // 0..2 appear 4 times, 3..4 three times
  const int64_t N = int64_t(pos.size()), maxT = 32;
  const int V = 5, C = 130;  // a partial third channel block
  const auto tok = random_ids(N, V, 23);
  const auto dout = randn(N * C, 24);
  const auto dwte0 = randn(V * C, 25), dwpe0 = randn(maxT * C, 26);
  auto want_te = dwte0, want_pe = dwpe0;
  ref_scatter(want_te, dout, tok, C);
  ref_scatter(want_pe, dout, pos, C);
  auto dwte = dwte0, dwpe = dwpe0;
  k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), pos.data(), N, C);
  EXPECT_TRUE(bitwise_equal(dwte, want_te));
  EXPECT_TRUE(bitwise_equal(dwpe, want_pe));
  // Position 0 gets its four rows' gradients: rows 0, 5, 13 and 16.
  for (int c = 0; c < C; c++) {
    float sum = dwpe0[c];
    for (int64_t r : {0, 5, 13, 16}) sum += dout[r * C + c];
    ASSERT_EQ(dwpe[c], sum) << c;
  }
  // Positions no row has keep their gradient.
  for (int64_t p = 8; p < 24; p++)
    ASSERT_TRUE(bitwise_equal(dwpe.data() + p * C, dwpe0.data() + p * C, C)) << p;
}

TEST(Embedding, BackwardScatterIndependentOfThreadCount) {
  // Many rows over few tokens and positions: every table row is summed from many rows.
  const int64_t N = 600, maxT = 7;
  const int V = 4, C = 300;
  const auto tok = random_ids(N, V, 27);
  const auto pos = random_ids(N, int(maxT), 28);
  const auto dout = randn(N * C, 29);
  const auto dwte0 = randn(V * C, 30), dwpe0 = randn(maxT * C, 31);
  auto run = [&](int threads) {
    Threads th(threads);
    std::vector<float> dwte = dwte0, dwpe = dwpe0, pe_only = dwpe0;
    k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), pos.data(), N, C);
    k::position_backward(pe_only.data(), dout.data(), pos.data(), N, C);
    return std::vector<std::vector<float>>{dwte, dwpe, pe_only};
  };
  const auto a = run(1);
  for (int threads : {2, 3}) {
    const auto b = run(threads);
    for (size_t i = 0; i < a.size(); i++)
      EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "output " << i << ", " << threads << " threads";
  }
}

TEST(Embedding, PositionAddAndBackwardTakeEachRowsPosition) {
  const auto pos = restart_and_zigzag_positions();
  const int64_t n = int64_t(pos.size()), maxT = 32;
  const int C = 70;
  const auto wpe = randn(maxT * C, 32), x = randn(n * C, 33), dout = randn(n * C, 34);
  auto out = x;
  k::position_add(out.data(), wpe.data(), pos.data(), n, C);
  for (int64_t i = 0; i < n; i++)
    for (int c = 0; c < C; c++) ASSERT_EQ(out[i * C + c], x[i * C + c] + wpe[pos[i] * C + c]);
  const auto dwpe0 = randn(maxT * C, 35);
  auto want = dwpe0, dwpe = dwpe0;
  ref_scatter(want, dout, pos, C);
  k::position_backward(dwpe.data(), dout.data(), pos.data(), n, C);
  EXPECT_TRUE(bitwise_equal(dwpe, want));
}

TEST(Embedding, ForwardIndependentOfThreadCount) {
  const int64_t B = 4, T = 33;
  const int V = 50, C = 96;
  const auto wte = randn(V * C, 10), wpe = randn(64 * C, 11);
  const auto tok = random_ids(B * T, V, 12);
  const auto pos = sequence_positions(B, T, 3);
  auto run = [&](int threads) {
    Threads th(threads);
    std::vector<float> out(B * T * C);
    k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), pos.data(), B * T, C, 64);
    return out;
  };
  EXPECT_TRUE(bitwise_equal(run(1), run(3)));
}

TEST(Embedding, RejectsBadInputs) {
  std::vector<float> buf(256, 0.0f);
  float* p = buf.data();
  std::vector<int32_t> tok = {0, 1, -3, 2}, pos = {0, 1, 2, 3};
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, pos.data(), 4, 8, 4), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), pos.data(), 4, 8), cleave::Error);
  tok = {0, 1, 2, 3};
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, pos.data(), 4, 0, 4), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), pos.data(), -1, 8), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), pos.data(), 4, -8), cleave::Error);
  // Positions are needed whenever a position table is.
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, nullptr, 4, 8, 4), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), nullptr, 4, 8), cleave::Error);
  EXPECT_THROW(k::position_add(p, p, nullptr, 4, 8), cleave::Error);
}

TEST(Embedding, RejectsPositionsOutOfRange) {
  std::vector<float> buf(256, 0.0f);
  float* p = buf.data();
  const std::vector<int32_t> tok = {0, 1, 2, 3}, high = {0, 1, 4, 3}, neg = {0, 1, 2, -1};
  // wpe has 4 rows: position 4 is one past its end.
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, high.data(), 4, 8, 4), cleave::Error);
  EXPECT_THROW(k::embedding_forward(p, tok.data(), p, p, neg.data(), 4, 8, 4), cleave::Error);
  EXPECT_THROW(k::embedding_backward(p, p, p, tok.data(), neg.data(), 4, 8), cleave::Error);
  EXPECT_THROW(k::position_add(p, p, neg.data(), 4, 8), cleave::Error);
  EXPECT_THROW(k::position_backward(p, p, neg.data(), 4, 8), cleave::Error);
  try {
    k::embedding_forward(p, tok.data(), p, p, high.data(), 4, 8, 4);
    FAIL() << "no error";
  } catch (const cleave::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("row 2"), std::string::npos) << what;
    EXPECT_NE(what.find("position 4"), std::string::npos) << what;
  }
  // Without a position table the positions are not read, whatever they hold.
  k::embedding_forward(p, tok.data(), p, nullptr, high.data(), 4, 8, 0);
  k::embedding_backward(p, nullptr, p, tok.data(), neg.data(), 4, 8);
  k::embedding_forward(p, tok.data(), p, p, tok.data(), 4, 8, 4);  // positions 0..max_pos-1
}
