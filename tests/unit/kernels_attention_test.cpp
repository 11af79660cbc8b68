// Blockwise causal GQA attention against a materialised double-precision reference: forward, lse,
// analytic backward, finite differences, packed qkv layout, determinism across thread counts and
// input checks.
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
using cleave::kernels::AttentionShape;

struct Case {
  int64_t B, T;
  int H, Hkv, hd;
  bool packed;  // q, k, v interleaved in one [B*T, (H + 2 Hkv) hd] buffer
};

// Inputs and gradients laid out as the case asks, plus plain [B*T, H*hd] out / dout.
struct Problem {
  AttentionShape s;
  std::vector<float> qbuf, kbuf, vbuf;  // kbuf/vbuf unused when packed
  const float *q, *k, *v;
  std::vector<float> dout;

  Problem(const Case& c, uint32_t seed, float qk_scale = 1.0f) {
    s.B = c.B, s.T = c.T, s.n_heads = c.H, s.n_kv_heads = c.Hkv, s.head_dim = c.hd;
    const int64_t rows = c.B * c.T;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    if (c.packed) {
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
      kbuf.resize(rows * s.kv_row_stride);
      vbuf.resize(rows * s.kv_row_stride);
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
  }
  float qv(int64_t b, int64_t t, int h, int d) const {
    return q[(b * s.T + t) * s.q_row_stride + int64_t{h} * s.head_dim + d];
  }
  float kv(const float* p, int64_t b, int64_t t, int g, int d) const {
    return p[(b * s.T + t) * s.kv_row_stride + int64_t{g} * s.head_dim + d];
  }
};

// Materialised reference in double. Gradients are dense [B*T, H*hd] / [B*T, Hkv*hd].
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Problem& p) {
  const auto& s = p.s;
  const int64_t T = s.T;
  const int H = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim, group = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(hd));
  Reference r;
  r.out.assign(s.B * T * H * hd, 0.0);
  r.lse.assign(s.B * H * T, 0.0);
  r.dq.assign(s.B * T * H * hd, 0.0);
  r.dk.assign(s.B * T * Hkv * hd, 0.0);
  r.dv.assign(s.B * T * Hkv * hd, 0.0);
  std::vector<double> P(T * T), dP(T * T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += double(p.qv(b, i, h, d)) * p.kv(p.k, b, j, g, d);
          P[i * T + j] = acc * scale;
          mx = std::max(mx, P[i * T + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * T + j] - mx);
        r.lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = std::exp(P[i * T + j] - mx) / sum;
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += P[i * T + j] * p.kv(p.v, b, j, g, d);
          r.out[((b * T + i) * H + h) * hd + d] = acc;
        }
      }
      // Backward: dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q.
      for (int64_t i = 0; i < T; ++i) {
        const float* dO = &p.dout[((b * T + i) * H + h) * hd];
        double D = 0;
        for (int d = 0; d < hd; ++d) D += double(dO[d]) * r.out[((b * T + i) * H + h) * hd + d];
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int d = 0; d < hd; ++d) acc += double(dO[d]) * p.kv(p.v, b, j, g, d);
          const double ds = P[i * T + j] * (acc - D);
          for (int d = 0; d < hd; ++d) {
            r.dv[((b * T + j) * Hkv + g) * hd + d] += P[i * T + j] * dO[d];
            r.dq[((b * T + i) * H + h) * hd + d] += scale * ds * p.kv(p.k, b, j, g, d);
            r.dk[((b * T + j) * Hkv + g) * hd + d] += scale * ds * p.qv(b, i, h, d);
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
  const int64_t rows = s.B * s.T;
  r.dq.assign(rows * s.q_row_stride, std::nanf(""));
  r.dk.assign(rows * s.kv_row_stride, std::nanf(""));
  r.dv.assign(rows * s.kv_row_stride, std::nanf(""));
  attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), p.dout.data(), p.q, p.k, p.v,
                     r.out.data(), r.lse.data(), s);
  return r;
}

// Max |a - b| over a strided float array vs a dense double one, relative to max(max |b|, 1) (an
// all-zero gradient, e.g. dq at T = 1, is compared in absolute terms).
double max_rel_err(const float* a, int64_t stride, const std::vector<double>& b, int64_t rows,
                   int64_t cols) {
  double err = 0, mag = 1.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      err = std::max(err, std::abs(double(a[r * stride + c]) - b[r * cols + c]));
      mag = std::max(mag, std::abs(b[r * cols + c]));
    }
  return err / mag;
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
  double lse_err = 0;
  for (size_t i = 0; i < ref.lse.size(); ++i)
    lse_err = std::max(lse_err, std::abs(res.lse[i] - ref.lse[i]));
  EXPECT_LT(lse_err, 2e-5);

  EXPECT_LT(max_rel_err(res.dq.data(), s.q_row_stride, ref.dq, rows, H * hd), 2e-5);
  if (c.packed) {  // k, v, dk, dv columns sit after the q head columns
    EXPECT_LT(max_rel_err(res.dk.data() + H * hd, s.kv_row_stride, ref.dk, rows, Hkv * hd), 2e-5);
    EXPECT_LT(max_rel_err(res.dv.data() + (H + Hkv) * hd, s.kv_row_stride, ref.dv, rows, Hkv * hd),
              2e-5);
  } else {
    EXPECT_LT(max_rel_err(res.dk.data(), s.kv_row_stride, ref.dk, rows, Hkv * hd), 2e-5);
    EXPECT_LT(max_rel_err(res.dv.data(), s.kv_row_stride, ref.dv, rows, Hkv * hd), 2e-5);
  }
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
  const Case c{2, 300, 4, 2, 64, true};
  const Problem p(c, 11);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result a = run(p);
  omp_set_num_threads(3);
  const Result b = run(p);
  const Result b2 = run(p);
  omp_set_num_threads(saved);
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), sizeof(float) * x.size()) == 0;
  };
  EXPECT_TRUE(same(a.out, b.out));
  EXPECT_TRUE(same(a.lse, b.lse));
  EXPECT_TRUE(same(a.dq, b.dq));
  EXPECT_TRUE(same(a.dk, b.dk));
  EXPECT_TRUE(same(a.dv, b.dv));
  EXPECT_TRUE(same(b.dq, b2.dq) && same(b.dk, b2.dk) && same(b.dv, b2.dv));
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
  };
  for (auto breaker : breakers) {
    AttentionShape s = p.s;
    breaker(s);
    EXPECT_THROW(fwd(s), cleave::Error);
    EXPECT_THROW(bwd(s), cleave::Error);
  }
  EXPECT_THROW(attention_forward(nullptr, lse.data(), p.q, p.k, p.v, p.s), cleave::Error);
  EXPECT_THROW(attention_backward(dq.data(), nullptr, dv.data(), p.dout.data(), p.q, p.k, p.v,
                                  out.data(), lse.data(), p.s),
               cleave::Error);
}

}  // namespace
