// Blockwise causal GQA attention against a materialised double-precision reference: forward, lse,
// analytic backward, finite differences, packed qkv layout, determinism across thread counts and
// input checks; token ranges and document ids; ring attention's merge over key ranges.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"

namespace {

using cleave::kernels::attention_backward;
using cleave::kernels::attention_forward;
using cleave::kernels::attention_merge;
using cleave::kernels::AttentionShape;

struct Case {
  int64_t B, T;
  int H, Hkv, hd;
  bool packed;  // q, k, v interleaved in one [B*T, (H + 2 Hkv) hd] buffer
};

// Which tokens the rows are. Sequence b's documents start at tokens doc_starts[i] + 7 b (one
// document when empty), so the batches' boundaries differ.
struct Tokens {
  int64_t Tk = 0, q_begin = 0, k_begin = 0;
  std::vector<int64_t> doc_starts;
};

// Inputs and gradients laid out as the case asks, plus plain [B*T, H*hd] out / dout.
struct Problem {
  AttentionShape s;
  std::vector<float> qbuf, kbuf, vbuf;  // kbuf/vbuf unused when packed
  const float *q, *k, *v;
  std::vector<float> dout;
  std::vector<int32_t> q_ids, k_ids;

  Problem(const Case& c, uint32_t seed, float qk_scale = 1.0f, const Tokens& tok = {}) {
    s.B = c.B, s.T = c.T, s.n_heads = c.H, s.n_kv_heads = c.Hkv, s.head_dim = c.hd;
    s.Tk = tok.Tk, s.q_begin = tok.q_begin, s.k_begin = tok.k_begin;
    const int64_t rows = c.B * c.T, krows = c.B * s.keys();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    if (c.packed) {  // one row per token: as many keys as queries
      s.q_row_stride = s.kv_row_stride = int64_t{c.H + 2 * c.Hkv} * c.hd;
      qbuf.resize(rows * s.q_row_stride);
      for (auto& x : qbuf) x = nd(rng);
      q = qbuf.data();
      k = q + int64_t{c.H} * c.hd;
      v = k + int64_t{c.Hkv} * c.hd;
    } else {
      s.q_row_stride = int64_t{c.H} * c.hd;
      s.kv_row_stride = int64_t{c.Hkv} * c.hd;
      qbuf.resize(rows * s.q_row_stride);
      kbuf.resize(krows * s.kv_row_stride);
      vbuf.resize(krows * s.kv_row_stride);
      for (auto& x : qbuf) x = nd(rng);
      for (auto& x : kbuf) x = nd(rng);
      for (auto& x : vbuf) x = nd(rng);
      q = qbuf.data(), k = kbuf.data(), v = vbuf.data();
    }
    if (qk_scale != 1.0f) {  // sharper softmax: scale q (and in packed layout k too)
      for (auto& x : qbuf) x *= qk_scale;
    }
    dout.resize(rows * c.H * c.hd);
    for (auto& x : dout) x = nd(rng);
    if (!tok.doc_starts.empty()) {
      auto ids = [&](std::vector<int32_t>& out, int64_t n, int64_t begin) {
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < n; ++t) {
            int32_t id = 0;
            for (int64_t start : tok.doc_starts) id += start + 7 * b <= begin + t;
            out.push_back(id);
          }
      };
      ids(q_ids, c.T, tok.q_begin);
      ids(k_ids, s.keys(), tok.k_begin);
      s.q_seq = q_ids.data(), s.k_seq = k_ids.data();
    }
  }
  Problem(const Problem&) = delete;  // q, k, v and s point into the buffers
  float qv(int64_t b, int64_t t, int h, int d) const {
    return q[(b * s.T + t) * s.q_row_stride + int64_t{h} * s.head_dim + d];
  }
  float kv(const float* p, int64_t b, int64_t t, int g, int d) const {
    return p[(b * s.keys() + t) * s.kv_row_stride + int64_t{g} * s.head_dim + d];
  }
  bool sees(int64_t b, int64_t i, int64_t j) const {
    return s.k_begin + j <= s.q_begin + i &&
           (!s.q_seq || s.q_seq[b * s.T + i] == s.k_seq[b * s.keys() + j]);
  }
};

// Materialised reference in double. Gradients are dense [B*T, H*hd] / [B*Tk, Hkv*hd]. A query that
// sees no key gets out 0, lse -inf and no gradient.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Problem& p) {
  const auto& s = p.s;
  const int64_t T = s.T, Tk = s.keys();
  const int H = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim, group = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(hd));
  Reference r;
  r.out.assign(s.B * T * H * hd, 0.0);
  r.lse.assign(s.B * H * T, -std::numeric_limits<double>::infinity());
  r.dq.assign(s.B * T * H * hd, 0.0);
  r.dk.assign(s.B * Tk * Hkv * hd, 0.0);
  r.dv.assign(s.B * Tk * Hkv * hd, 0.0);
  std::vector<double> P(T * Tk);
  for (int64_t b = 0; b < s.B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!p.sees(b, i, j)) continue;
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += double(p.qv(b, i, h, d)) * p.kv(p.k, b, j, g, d);
          P[i * Tk + j] = acc * scale;
          mx = std::max(mx, P[i * Tk + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < Tk; ++j)
          if (p.sees(b, i, j)) sum += std::exp(P[i * Tk + j] - mx);
        if (sum == 0) continue;
        r.lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int64_t j = 0; j < Tk; ++j)
          P[i * Tk + j] = p.sees(b, i, j) ? std::exp(P[i * Tk + j] - mx) / sum : 0.0;
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < Tk; ++j) acc += P[i * Tk + j] * p.kv(p.v, b, j, g, d);
          r.out[((b * T + i) * H + h) * hd + d] = acc;
        }
      }
      // Backward: dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
      for (int64_t i = 0; i < T; ++i) {
        const float* dO = &p.dout[((b * T + i) * H + h) * hd];
        double D = 0;
        for (int d = 0; d < hd; ++d) D += double(dO[d]) * r.out[((b * T + i) * H + h) * hd + d];
        for (int64_t j = 0; j < Tk; ++j) {
          if (!p.sees(b, i, j)) continue;
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += double(dO[d]) * p.kv(p.v, b, j, g, d);
          const double ds = P[i * Tk + j] * (acc - D);
          for (int d = 0; d < hd; ++d) {
            r.dv[((b * Tk + j) * Hkv + g) * hd + d] += P[i * Tk + j] * dO[d];
            r.dq[((b * T + i) * H + h) * hd + d] += scale * ds * p.kv(p.k, b, j, g, d);
            r.dk[((b * Tk + j) * Hkv + g) * hd + d] += scale * ds * p.qv(b, i, h, d);
          }
        }
      }
    }
  return r;
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;  // dq/dk/dv in the input layout (strided)
};

Result run(const Problem& p, bool backward = true) {
  const auto& s = p.s;
  Result r;
  r.out.assign(s.B * s.T * s.n_heads * s.head_dim, std::nanf(""));
  r.lse.assign(s.B * s.n_heads * s.T, std::nanf(""));
  attention_forward(r.out.data(), r.lse.data(), p.q, p.k, p.v, s);
  if (!backward) return r;
  r.dq.assign(s.B * s.T * s.q_row_stride, std::nanf(""));
  r.dk.assign(s.B * s.keys() * s.kv_row_stride, std::nanf(""));
  r.dv.assign(s.B * s.keys() * s.kv_row_stride, std::nanf(""));
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), p.q, p.k, p.v,
                     r.out.data(), r.lse.data(), s);
  return r;
}

// Max |a - b| over a strided float array vs a dense double one, relative to max(max |b|, 1) (an
// all-zero gradient, e.g. dq at T = 1, is compared in absolute terms). NaN in a gives infinity.
double max_rel_err(const float* a, int64_t stride, const std::vector<double>& b, int64_t rows,
                   int64_t cols) {
  double err = 0, mag = 1.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      if (std::isnan(a[r * stride + c])) return std::numeric_limits<double>::infinity();
      err = std::max(err, std::abs(double(a[r * stride + c]) - b[r * cols + c]));
      mag = std::max(mag, std::abs(b[r * cols + c]));
    }
  return err / mag;
}

// Max |a - b| of log-sum-exps; -inf (no key seen) must match exactly.
double lse_err(const float* a, const double* b, int64_t n) {
  double err = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i]) || std::isnan(a[i])) {
      if (!(a[i] == b[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    err = std::max(err, std::abs(a[i] - b[i]));
  }
  return err;
}

bool same(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), sizeof(float) * x.size()) == 0;
}

std::string name(const Case& c) {
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) +
         "_Hkv" + std::to_string(c.Hkv) + "_hd" + std::to_string(c.hd) +
         (c.packed ? "_packed" : "_separate");
}

void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

class AttentionVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionVsReference, ForwardLseAndBackward) {
  const Case c = GetParam();
  const Problem p(c, 1234 + c.T + 7 * c.hd + 13 * c.Hkv);
  const Reference ref = reference(p);
  const Result res = run(p);
  const auto& s = p.s;
  const int64_t rows = s.B * s.T, H = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim;

  EXPECT_LT(max_rel_err(res.out.data(), H * hd, ref.out, rows, H * hd), 5e-6);
  EXPECT_LT(lse_err(res.lse.data(), ref.lse.data(), int64_t(ref.lse.size())), 2e-5);

  // dq, dk and dv have buffers of their own (with the packed row stride): heads from column 0.
  EXPECT_LT(max_rel_err(res.dq.data(), s.q_row_stride, ref.dq, rows, H * hd), 2e-5);
  EXPECT_LT(max_rel_err(res.dk.data(), s.kv_row_stride, ref.dk, rows, Hkv * hd), 2e-5);
  EXPECT_LT(max_rel_err(res.dv.data(), s.kv_row_stride, ref.dv, rows, Hkv * hd), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionVsReference,
    ::testing::Values(Case{1, 1, 1, 1, 16, false}, Case{2, 37, 4, 4, 16, false},
                      Case{2, 37, 4, 2, 16, true}, Case{1, 37, 4, 1, 64, false},
                      Case{1, 130, 4, 2, 16, false}, Case{1, 130, 4, 1, 64, true},
                      Case{2, 64, 2, 2, 64, false}, Case{1, 200, 4, 2, 32, true},
                      Case{1, 70, 2, 1, 24, false}, Case{1, 129, 3, 3, 128, false},
                      Case{1, 45, 2, 2, 7, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return name(info.param); });

// A peaked softmax (large logits) exercises the running-max rescaling across key blocks.
TEST(Attention, SharpSoftmaxMatchesReference) {
  const Case c{1, 150, 2, 1, 16, false};
  const Problem p(c, 99, 4.0f);
  const Reference ref = reference(p);
  const Result res = run(p);
  EXPECT_LT(max_rel_err(res.out.data(), 2 * 16, ref.out, 150, 2 * 16), 1e-5);
  EXPECT_LT(max_rel_err(res.dq.data(), 2 * 16, ref.dq, 150, 2 * 16), 1e-4);
  EXPECT_LT(max_rel_err(res.dk.data(), 16, ref.dk, 150, 16), 1e-4);
  EXPECT_LT(max_rel_err(res.dv.data(), 16, ref.dv, 150, 16), 1e-4);
}

// Central differences of L = sum(dout * out) (summed in double) against the backward pass.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  const Case c{1, 70, 2, 1, 16, false};  // two key blocks, GQA
  Problem p(c, 7);
  const auto& s = p.s;
  const Result res = run(p);
  auto loss = [&] {
    const Result r = run(p, false);
    double L = 0;
    for (size_t i = 0; i < r.out.size(); ++i) L += double(p.dout[i]) * r.out[i];
    return L;
  };
  const float h = 1e-2f;
  auto check = [&](std::vector<float>& buf, const std::vector<float>& grad, const char* what) {
    double max_err = 0, max_g = 0;
    for (size_t i = 0; i < buf.size(); i += 5) {
      const float x = buf[i];
      buf[i] = x + h;
      const double lp = loss();
      buf[i] = x - h;
      const double lm = loss();
      buf[i] = x;
      const double fd = (lp - lm) / (double(x + h) - double(x - h));
      max_err = std::max(max_err, std::abs(fd - grad[i]));
      max_g = std::max(max_g, std::abs(fd));
    }
    EXPECT_LT(max_err, 2e-3 + 5e-3 * max_g) << what;
  };
  check(p.qbuf, res.dq, "dq");
  check(p.kbuf, res.dk, "dk");
  check(p.vbuf, res.dv, "dv");
  (void)s;
}

// Packed layout writes exactly the gradient columns, and equals the separate-buffer result.
TEST(Attention, PackedAndPaddedStridesMatchSeparate) {
  const Case c{2, 100, 4, 2, 16, false};
  const Problem sep(c, 5);
  const Result rs = run(sep);
  const int64_t rows = c.B * c.T, qw = 4 * 16, kw = 2 * 16, pad = 3;
  const int64_t stride = qw + 2 * kw + pad;  // packed plus 3 unused floats per row
  std::vector<float> qkv(rows * stride, -7.0f);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(&qkv[r * stride], &sep.q[r * qw], sizeof(float) * qw);
    std::memcpy(&qkv[r * stride + qw], &sep.k[r * kw], sizeof(float) * kw);
    std::memcpy(&qkv[r * stride + qw + kw], &sep.v[r * kw], sizeof(float) * kw);
  }
  AttentionShape s = sep.s;
  s.q_row_stride = s.kv_row_stride = stride;
  std::vector<float> out(rows * qw), lse(c.B * 4 * c.T), dqkv(rows * stride, -7.0f);
  const float *q = qkv.data(), *k = q + qw, *v = k + kw;
  attention_forward(out.data(), lse.data(), q, k, v, s);
  attention_backward(dqkv.data(), dqkv.data() + qw, dqkv.data() + qw + kw, sep.dout.data(), q, k, v,
                     out.data(), lse.data(), s);
  EXPECT_EQ(0, std::memcmp(out.data(), rs.out.data(), sizeof(float) * out.size()));
  EXPECT_EQ(0, std::memcmp(lse.data(), rs.lse.data(), sizeof(float) * lse.size()));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(0, std::memcmp(&dqkv[r * stride], &rs.dq[r * qw], sizeof(float) * qw));
    EXPECT_EQ(0, std::memcmp(&dqkv[r * stride + qw], &rs.dk[r * kw], sizeof(float) * kw));
    EXPECT_EQ(0, std::memcmp(&dqkv[r * stride + qw + kw], &rs.dv[r * kw], sizeof(float) * kw));
    for (int64_t i = 0; i < pad; ++i) EXPECT_EQ(dqkv[r * stride + qw + 2 * kw + i], -7.0f);
  }
}

TEST(Attention, BitwiseIdenticalAcrossThreadCounts) {
  const Problem plain(Case{2, 300, 4, 2, 64, true}, 11);
  const Problem ranged(Case{2, 200, 4, 2, 32, false}, 12, 1.0f, Tokens{150, 100, 20, {37, 150}});
  const int saved = omp_get_max_threads();
  for (const Problem* p : {&plain, &ranged}) {
    omp_set_num_threads(1);
    const Result a = run(*p);
    omp_set_num_threads(3);
    const Result b = run(*p);
    const Result b2 = run(*p);
    omp_set_num_threads(saved);
    EXPECT_TRUE(same(a.out, b.out));
    EXPECT_TRUE(same(a.lse, b.lse));
    EXPECT_TRUE(same(a.dq, b.dq));
    EXPECT_TRUE(same(a.dk, b.dk));
    EXPECT_TRUE(same(a.dv, b.dv));
    EXPECT_TRUE(same(b.dq, b2.dq) && same(b.dk, b2.dk) && same(b.dv, b2.dv));
  }
}

// Spelling the defaults out (equal begins, Tk = T, one document) computes the same thing the same
// way: bit for bit.
TEST(Attention, ExplicitDefaultsAreBitwiseDefault) {
  const Case c{2, 300, 4, 2, 64, true};
  Problem p(c, 11);
  const Result a = run(p);
  const std::vector<int32_t> ids(c.B * c.T, 3);
  p.s.Tk = c.T, p.s.q_begin = p.s.k_begin = 1000, p.s.q_seq = p.s.k_seq = ids.data();
  const Result b = run(p);
  EXPECT_TRUE(same(a.out, b.out) && same(a.lse, b.lse));
  EXPECT_TRUE(same(a.dq, b.dq) && same(a.dk, b.dk) && same(a.dv, b.dv));
}

struct RangeCase {
  std::string name;
  Case c;
  Tokens tok;
};

void PrintTo(const RangeCase& r, std::ostream* os) { *os << r.name; }

class AttentionRangesVsReference : public ::testing::TestWithParam<RangeCase> {};

TEST_P(AttentionRangesVsReference, ForwardLseAndBackward) {
  const RangeCase& rc = GetParam();
  const Problem p(rc.c, 4321 + rc.c.T, 1.0f, rc.tok);
  const Reference ref = reference(p);
  const Result res = run(p);
  const auto& s = p.s;
  const int64_t rows = s.B * s.T, krows = s.B * s.keys(), H = s.n_heads, hd = s.head_dim;
  EXPECT_LT(max_rel_err(res.out.data(), H * hd, ref.out, rows, H * hd), 5e-6);
  EXPECT_LT(lse_err(res.lse.data(), ref.lse.data(), int64_t(ref.lse.size())), 2e-5);
  EXPECT_LT(max_rel_err(res.dq.data(), s.q_row_stride, ref.dq, rows, H * hd), 2e-5);
  EXPECT_LT(max_rel_err(res.dk.data(), s.kv_row_stride, ref.dk, krows, s.kv_row_stride), 2e-5);
  EXPECT_LT(max_rel_err(res.dv.data(), s.kv_row_stride, ref.dv, krows, s.kv_row_stride), 2e-5);
  // A query that sees no key: exactly 0 out and 0 dq (the reference's -inf lse matched above).
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        if (!std::isinf(ref.lse[(b * H + h) * s.T + t])) continue;
        for (int64_t d = 0; d < hd; ++d) {
          ASSERT_EQ(res.out[((b * s.T + t) * H + h) * hd + d], 0.0f);
          ASSERT_EQ(res.dq[(b * s.T + t) * s.q_row_stride + h * hd + d], 0.0f);
        }
      }
}

// Block size 64; sizes and boundaries off its multiples. Tokens{Tk, q_begin, k_begin, doc starts}.
INSTANTIATE_TEST_SUITE_P(
    Ranges, AttentionRangesVsReference,
    ::testing::Values(
        RangeCase{"QueriesAfterAllKeys", {1, 100, 4, 2, 16, false}, {150, 150, 0, {}}},
        RangeCase{"KeysReachPastQueries", {2, 37, 4, 2, 16, false}, {150, 100, 20, {}}},
        RangeCase{"MoreQueriesThanKeys", {1, 150, 2, 1, 32, false}, {100, 37, 0, {}}},
        RangeCase{"FirstQueriesSeeNoKey", {2, 100, 2, 2, 16, false}, {100, 0, 50, {}}},
        RangeCase{"Documents", {2, 150, 4, 2, 16, false}, {0, 0, 0, {37, 100}}},
        RangeCase{"DocumentAtBlockEdge", {1, 130, 2, 2, 16, false}, {0, 0, 0, {64}}},
        RangeCase{"ShortDocuments", {1, 200, 2, 1, 16, false}, {0, 0, 0, {5, 13, 30, 31, 32, 65}}},
        RangeCase{"DocumentsAndRanges", {2, 100, 4, 1, 24, false}, {150, 150, 0, {20, 90, 170}}},
        RangeCase{"KeysInLaterDocuments", {1, 70, 2, 1, 16, false}, {80, 0, 60, {65}}}),
    [](const ::testing::TestParamInfo<RangeCase>& info) { return info.param.name; });

// Keys [a, a + n) in buffers of their own, [B, n] (a rank's chunk under context parallelism).
struct KeyPart {
  AttentionShape s;
  std::vector<float> k, v;
  std::vector<int32_t> ids;
  KeyPart(const Problem& p, int64_t a, int64_t n) : s(p.s) {
    const int64_t Tk = p.s.keys(), kvs = p.s.kv_row_stride;
    for (int64_t b = 0; b < s.B; ++b) {
      k.insert(k.end(), p.k + (b * Tk + a) * kvs, p.k + (b * Tk + a + n) * kvs);
      v.insert(v.end(), p.v + (b * Tk + a) * kvs, p.v + (b * Tk + a + n) * kvs);
      if (p.s.k_seq) ids.insert(ids.end(), p.s.k_seq + b * Tk + a, p.s.k_seq + b * Tk + a + n);
    }
    s.Tk = n, s.k_begin = p.s.k_begin + a, s.k_seq = p.s.k_seq ? ids.data() : nullptr;
  }
  KeyPart(const KeyPart&) = delete;  // s points into ids
};

// Ring attention on one rank: forward per key part merged by lse into (0, -inf), then backward per
// part with the merged out and lse, summed with accumulate onto gradients that start at `base`.
// Returns the merged out and lse and the gradient sums less `base`, dk and dv laid out whole.
Result run_in_parts(const Problem& p, const std::vector<int64_t>& sizes, float base = 0.5f) {
  const auto& s = p.s;
  const int64_t B = s.B, Tk = s.keys(), kvs = s.kv_row_stride;
  Result r;
  r.out.assign(B * s.T * s.n_heads * s.head_dim, 0.0f);
  r.lse.assign(B * s.n_heads * s.T, -std::numeric_limits<float>::infinity());
  std::vector<float> out(r.out.size()), lse(r.lse.size());
  for (int64_t a = 0; const int64_t n : sizes) {
    const KeyPart kp(p, a, n);
    attention_forward(out.data(), lse.data(), p.q, kp.k.data(), kp.v.data(), kp.s);
    attention_merge(r.out.data(), r.lse.data(), out.data(), lse.data(), kp.s);
    a += n;
  }
  r.dq.assign(B * s.T * s.q_row_stride, base);
  r.dk.assign(B * Tk * kvs, 0.0f);
  r.dv.assign(B * Tk * kvs, 0.0f);
  for (int64_t a = 0; const int64_t n : sizes) {
    const KeyPart kp(p, a, n);
    std::vector<float> dk(B * n * kvs, base), dv = dk;
    attention_backward(r.dq.data(), dk.data(), dv.data(), p.dout.data(), p.q, kp.k.data(),
                       kp.v.data(), r.out.data(), r.lse.data(), kp.s, true);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n * kvs; ++i) {
        r.dk[(b * Tk + a) * kvs + i] = dk[b * n * kvs + i] - base;
        r.dv[(b * Tk + a) * kvs + i] = dv[b * n * kvs + i] - base;
      }
    a += n;
  }
  for (auto& x : r.dq) x -= base;
  return r;
}

// Max |a - b| / max(max |b|, 1) over float arrays; NaN gives infinity.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mag = 1.0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(double(a[i]) - b[i]));
    mag = std::max(mag, std::abs(double(b[i])));
  }
  return err / mag;
}

TEST(AttentionMerge, UnevenKeyPartsMatchWholeAttention) {
  auto check = [](const Case& c, const Tokens& tok, const std::vector<int64_t>& sizes) {
    SCOPED_TRACE(name(c) + ", " + std::to_string(sizes.size()) + " parts");
    const Problem p(c, 77 + sizes[0], 1.0f, tok);
    const Result whole = run(p);
    const Result parts = run_in_parts(p, sizes);
    EXPECT_LT(max_rel_diff(parts.out, whole.out), 1e-6);
    double lerr = 0;  // relative: an lse of 5 has float steps of 5e-7
    for (size_t i = 0; i < whole.lse.size(); ++i)
      lerr = std::max(lerr, std::abs(double(parts.lse[i]) - whole.lse[i]) /
                                std::max(1.0, std::abs(double(whole.lse[i]))));
    EXPECT_LT(lerr, 1e-6);
    EXPECT_LT(max_rel_diff(parts.dq, whole.dq), 1e-5);
    EXPECT_LT(max_rel_diff(parts.dk, whole.dk), 1e-5);
    EXPECT_LT(max_rel_diff(parts.dv, whole.dv), 1e-5);
  };
  check({2, 200, 4, 2, 32, false}, {}, {70, 130});
  check({2, 200, 4, 2, 32, false}, {}, {37, 100, 63});
  check({2, 200, 4, 1, 16, false}, {0, 0, 0, {50, 120}}, {90, 45, 65});  // documents
  check({1, 150, 2, 1, 16, false}, {200, 100, 0, {}}, {64, 100, 36});    // queries after keys
}

// Queries are tokens [100, 200) of document 1 (from token 90; 97 in sequence 1). Keys [0, 90) are
// all in document 0 and keys [200, 264) in the future: both parts see nothing, merge as no-ops and
// add no gradient.
TEST(AttentionMerge, FullyMaskedKeyPartsAreNoOps) {
  const Case c{2, 100, 4, 2, 16, false};
  const Problem p(c, 21, 1.0f, Tokens{264, 100, 0, {90}});
  const KeyPart seen(p, 90, 110), past(p, 0, 90), future(p, 200, 64);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t no = c.B * c.T * 4 * 16, nl = c.B * 4 * c.T;
  std::vector<float> out(no), lse(nl), out_p(no, 1.0f), lse_p(nl), out_f(no, 1.0f), lse_f(nl);
  attention_forward(out.data(), lse.data(), p.q, seen.k.data(), seen.v.data(), seen.s);
  attention_forward(out_p.data(), lse_p.data(), p.q, past.k.data(), past.v.data(), past.s);
  attention_forward(out_f.data(), lse_f.data(), p.q, future.k.data(), future.v.data(), future.s);
  for (size_t i = 0; i < no; ++i) ASSERT_TRUE(out_p[i] == 0.0f && out_f[i] == 0.0f);
  for (size_t i = 0; i < nl; ++i) ASSERT_TRUE(lse_p[i] == kNegInf && lse_f[i] == kNegInf);

  std::vector<float> m_out = out, m_lse = lse;  // seen, then past and future merged in
  attention_merge(m_out.data(), m_lse.data(), out_p.data(), lse_p.data(), p.s);
  attention_merge(m_out.data(), m_lse.data(), out_f.data(), lse_f.data(), p.s);
  EXPECT_TRUE(same(m_out, out) && same(m_lse, lse));
  std::vector<float> e_out = out_p, e_lse = lse_p;  // nothing, then seen merged in
  attention_merge(e_out.data(), e_lse.data(), out.data(), lse.data(), p.s);
  EXPECT_TRUE(same(e_out, out) && same(e_lse, lse));
  attention_merge(out_p.data(), lse_p.data(), out_f.data(), lse_f.data(), p.s);  // both nothing
  EXPECT_TRUE(same(out_p, std::vector<float>(no, 0.0f)));
  EXPECT_TRUE(same(lse_p, std::vector<float>(nl, kNegInf)));

  std::vector<float> dq(c.B * c.T * p.s.q_row_stride), dk(seen.k.size()), dv(dk.size());
  attention_backward(dq.data(), dk.data(), dv.data(), p.dout.data(), p.q, seen.k.data(),
                     seen.v.data(), out.data(), lse.data(), seen.s);
  const std::vector<float> dq_seen = dq;
  for (const KeyPart* kp : {&past, &future}) {
    const std::vector<float> twos(kp->k.size(), 2.0f), zeros(kp->k.size(), 0.0f);
    std::vector<float> dk_acc = twos, dv_acc = twos;  // accumulate: adds nothing
    attention_backward(dq.data(), dk_acc.data(), dv_acc.data(), p.dout.data(), p.q, kp->k.data(),
                       kp->v.data(), out.data(), lse.data(), kp->s, true);
    EXPECT_TRUE(same(dq, dq_seen) && same(dk_acc, twos) && same(dv_acc, twos));
    std::vector<float> dq_set(dq.size(), std::nanf("")), dk_set(kp->k.size(), std::nanf("")),
        dv_set = dk_set;  // write: zeros
    attention_backward(dq_set.data(), dk_set.data(), dv_set.data(), p.dout.data(), p.q,
                       kp->k.data(), kp->v.data(), out.data(), lse.data(), kp->s);
    EXPECT_TRUE(same(dq_set, std::vector<float>(dq.size(), 0.0f)));
    EXPECT_TRUE(same(dk_set, zeros) && same(dv_set, zeros));
  }
}

TEST(Attention, BadInputThrows) {
  const Case c{1, 8, 4, 2, 16, false};
  const Problem p(c, 3);
  std::vector<float> out(8 * 64), lse(4 * 8), dq(8 * 64), dk(8 * 32), dv(8 * 32);
  auto fwd = [&](AttentionShape s) { attention_forward(out.data(), lse.data(), p.q, p.k, p.v, s); };
  auto bwd = [&](AttentionShape s) {
    attention_backward(dq.data(), dk.data(), dv.data(), p.dout.data(), p.q, p.k, p.v, out.data(),
                       lse.data(), s);
  };
  EXPECT_NO_THROW(fwd(p.s));
  EXPECT_NO_THROW(bwd(p.s));
  const std::vector<void (*)(AttentionShape&)> breakers = {
      [](AttentionShape& s) { s.n_kv_heads = 3; },  // 4 % 3 != 0
      [](AttentionShape& s) { s.n_kv_heads = 0; },
      [](AttentionShape& s) { s.n_heads = 0; },
      [](AttentionShape& s) { s.head_dim = 0; },
      [](AttentionShape& s) { s.T = 0; },
      [](AttentionShape& s) { s.B = -1; },
      [](AttentionShape& s) { s.q_row_stride = 63; },   // < 4 * 16
      [](AttentionShape& s) { s.kv_row_stride = 31; },  // < 2 * 16
      [](AttentionShape& s) { s.Tk = -1; },
      [](AttentionShape& s) { s.q_begin = -1; },
      [](AttentionShape& s) { s.k_begin = -1; },
  };
  for (auto breaker : breakers) {
    AttentionShape s = p.s;
    breaker(s);
    EXPECT_THROW(fwd(s), cleave::Error);
    EXPECT_THROW(bwd(s), cleave::Error);
  }
  const std::vector<int32_t> ids = {0, 0, 1, 1, 1, 2, 2, 2}, unordered = {0, 0, 1, 1, 0, 2, 2, 2};
  AttentionShape s = p.s;
  s.q_seq = ids.data();  // without k_seq
  EXPECT_THROW(fwd(s), cleave::Error);
  s.k_seq = ids.data();
  EXPECT_NO_THROW(fwd(s));
  s.k_seq = unordered.data();
  EXPECT_THROW(fwd(s), cleave::Error);
  EXPECT_THROW(bwd(s), cleave::Error);
  EXPECT_THROW(attention_merge(out.data(), lse.data(), nullptr, lse.data(), p.s), cleave::Error);
  EXPECT_THROW(attention_forward(nullptr, lse.data(), p.q, p.k, p.v, p.s), cleave::Error);
  EXPECT_THROW(attention_backward(dq.data(), nullptr, dv.data(), p.dout.data(), p.q, p.k, p.v,
                                  out.data(), lse.data(), p.s),
               cleave::Error);
}

}  // namespace
