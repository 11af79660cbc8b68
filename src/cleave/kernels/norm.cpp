// LayerNorm and RMSNorm, forward and backward, over rows of C floats.
//
// Parallelism and determinism: forward and backward_input are independent per row, so rows are
// split among threads and each row is always computed by the same code. Row sums use kLanes
// independent accumulators (a vector register; no -ffast-math needed) that are added in a fixed
// order at the end. backward_weight sums over rows: rows are cut into chunks of kChunk
// (a constant, not the thread count), each chunk sums its rows in order into a partial, and the
// partials are added in chunk order, column by column. No atomics anywhere.
#include "cleave/kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cleave/base/check.h"

namespace cleave::kernels {
namespace {

constexpr int kLanes = 16;        // one AVX-512 register of floats
constexpr int64_t kChunk = 64;    // rows per partial sum in backward_weight
constexpr int kColBlock = 256;    // columns per task when adding up the partials

void check_shape(int64_t N, int C) {
  CLEAVE_CHECK(N >= 0, "N=" << N << " must be >= 0");
  CLEAVE_CHECK(C > 0, "C=" << C << " must be > 0");
}

// kLanes partial sums held in one vector: element c of a row goes to lane c % kLanes and the lanes
// are added in order at the end, so the summation order is fixed by the source. (Scalar loops
// over an array of lanes mean the same, but g++ 12 sometimes vectorises such a loop nest the
// wrong way round, into pages of shuffles; GCC vector types pin the layout down.)
using vfloat = float __attribute__((vector_size(kLanes * sizeof(float))));
// Double sums use two 8-lane halves (one register each) rather than one 16-double vector, which
// g++ lowers through the stack.
using vfloat8 = float __attribute__((vector_size(8 * sizeof(float))));
using vdouble8 = double __attribute__((vector_size(8 * sizeof(double))));

template <class V>
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vfloat load(const float* p) { return load<vfloat>(p); }
inline vdouble8 load_d(const float* p) {
  return __builtin_convertvector(load<vfloat8>(p), vdouble8);
}

template <class V>
inline auto lanes_total(const V& v) {
  auto s = v[0];
  for (int l = 1; l < static_cast<int>(sizeof(V) / sizeof(v[0])); l++) s += v[l];
  return s;
}

// sum_c x[c] in double.
double sum_d(const float* x, int C) {
  vdouble8 a0 = {}, a1 = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    a0 += load_d(x + c);
    a1 += load_d(x + c + 8);
  }
  double s = lanes_total(a0) + lanes_total(a1);
  for (; c < C; c++) s += x[c];
  return s;
}

// sum_c (x[c] - m)^2 in double (m = 0 gives the sum of squares).
double sumsq_d(const float* x, double m, int C) {
  vdouble8 a0 = {}, a1 = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes) {
    const vdouble8 d0 = load_d(x + c) - m, d1 = load_d(x + c + 8) - m;
    a0 += d0 * d0;
    a1 += d1 * d1;
  }
  double s = lanes_total(a0) + lanes_total(a1);
  for (; c < C; c++) s += (x[c] - m) * (x[c] - m);
  return s;
}

// Scratch for the per-chunk partial sums of backward_weight: reused across calls by each thread
// that calls a norm backward, so the hot path does not allocate after the first step.
std::vector<float>& partials_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// acc[c] += sum_k part[k * stride + c] for k in [0, nchunks), k in order; columns in parallel.
void add_partials(float* acc, const float* part, int64_t nchunks, int64_t stride, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock;
    const int c1 = std::min(C, c0 + kColBlock);
    float tot[kColBlock] = {};
    for (int64_t k = 0; k < nchunks; k++) {
      const float* p = part + k * stride;
      for (int c = c0; c < c1; c++) tot[c - c0] += p[c];
    }
    for (int c = c0; c < c1; c++) acc[c] += tot[c - c0];
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// LayerNorm: out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps), biased var.
// bias (forward) and dbias (backward_weight) may be null for a LayerNorm without bias.

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int C, float eps) {
  check_shape(N, C);
  CLEAVE_CHECK(eps >= 0.0f, "eps=" << eps << " must be >= 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* xi = x + i * C;
    float* oi = out + i * C;
    // Two passes over a row that sits in L1: exact-ish mean, then variance about it (no
    // E[x^2] - E[x]^2 cancellation).
    const double m = sum_d(xi, C) / C;
    const double var = sumsq_d(xi, m, C) / C;
    const float mf = static_cast<float>(m);
    const float sf = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    if (bias) {
      for (int c = 0; c < C; c++) oi[c] = (xi[c] - mf) * sf * weight[c] + bias[c];
    } else {
      for (int c = 0; c < C; c++) oi[c] = (xi[c] - mf) * sf * weight[c];
    }
    mean[i] = mf;
    rstd[i] = sf;
  }
}

void layernorm_backward_input(float* dx, const float* dout, const float* x, const float* weight,
                              const float* mean, const float* rstd, int64_t N, int C) {
  check_shape(N, C);
  const float invC = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* xi = x + i * C;
    const float* gi = dout + i * C;
    float* dxi = dx + i * C;
    const float m = mean[i], s = rstd[i];
    // With xhat = (x - m) s and g = dout * w:
    // dx = s * (g - mean(g) - xhat * mean(g * xhat)).
    vfloat acc_g = {}, acc_gx = {};
    int c = 0;
    for (; c + kLanes <= C; c += kLanes) {
      const vfloat g = load(gi + c) * load(weight + c);
      acc_g += g;
      acc_gx += g * ((load(xi + c) - m) * s);
    }
    float sum_g = lanes_total(acc_g), sum_gx = lanes_total(acc_gx);
    for (; c < C; c++) {
      const float g = gi[c] * weight[c];
      sum_g += g;
      sum_gx += g * ((xi[c] - m) * s);
    }
    const float g_mean = sum_g * invC;
    const float gx_mean = sum_gx * invC;
    for (int cc = 0; cc < C; cc++) {
      const float xhat = (xi[cc] - m) * s;
      dxi[cc] += s * (gi[cc] * weight[cc] - g_mean - xhat * gx_mean);
    }
  }
}

void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* x,
                               const float* mean, const float* rstd, int64_t N, int C) {
  check_shape(N, C);
  if (N == 0) return;
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
  std::vector<float>& part = partials_scratch(static_cast<size_t>(nchunks) * 2 * C);
  float* pw = part.data();                 // [nchunks, C] partial dweight
  float* pb = part.data() + nchunks * C;   // [nchunks, C] partial dbias
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < nchunks; k++) {
    float* w = pw + k * C;
    float* b = pb + k * C;
    for (int c = 0; c < C; c++) w[c] = b[c] = 0.0f;
    const int64_t r1 = std::min(N, (k + 1) * kChunk);
    for (int64_t i = k * kChunk; i < r1; i++) {
      const float* xi = x + i * C;
      const float* gi = dout + i * C;
      const float m = mean[i], s = rstd[i];
      for (int c = 0; c < C; c++) {
        w[c] += gi[c] * ((xi[c] - m) * s);
        b[c] += gi[c];
      }
    }
  }
  add_partials(dweight, pw, nchunks, C, C);
  if (dbias) add_partials(dbias, pb, nchunks, C, C);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps).

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t N, int C,
                     float eps) {
  check_shape(N, C);
  CLEAVE_CHECK(eps >= 0.0f, "eps=" << eps << " must be >= 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* xi = x + i * C;
    float* oi = out + i * C;
    const double ms = sumsq_d(xi, 0.0, C) / C;
    const float sf = static_cast<float>(1.0 / std::sqrt(ms + static_cast<double>(eps)));
    for (int c = 0; c < C; c++) oi[c] = xi[c] * sf * weight[c];
    rstd[i] = sf;
  }
}

void rmsnorm_backward_input(float* dx, const float* dout, const float* x, const float* weight,
                            const float* rstd, int64_t N, int C) {
  check_shape(N, C);
  const float invC = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* xi = x + i * C;
    const float* gi = dout + i * C;
    float* dxi = dx + i * C;
    const float s = rstd[i];
    // With xhat = x s and g = dout * w: dx = s * (g - xhat * mean(g * xhat)).
    vfloat acc = {};
    int c = 0;
    for (; c + kLanes <= C; c += kLanes)
      acc += load(gi + c) * load(weight + c) * (load(xi + c) * s);
    float sum_gx = lanes_total(acc);
    for (; c < C; c++) sum_gx += gi[c] * weight[c] * (xi[c] * s);
    const float gx_mean = sum_gx * invC;
    for (int cc = 0; cc < C; cc++)
      dxi[cc] += s * (gi[cc] * weight[cc] - (xi[cc] * s) * gx_mean);
  }
}

void rmsnorm_backward_weight(float* dweight, const float* dout, const float* x, const float* rstd,
                             int64_t N, int C) {
  check_shape(N, C);
  if (N == 0) return;
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
  std::vector<float>& part = partials_scratch(static_cast<size_t>(nchunks) * C);
  float* pw = part.data();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < nchunks; k++) {
    float* w = pw + k * C;
    for (int c = 0; c < C; c++) w[c] = 0.0f;
    const int64_t r1 = std::min(N, (k + 1) * kChunk);
    for (int64_t i = k * kChunk; i < r1; i++) {
      const float* xi = x + i * C;
      const float* gi = dout + i * C;
      const float s = rstd[i];
      for (int c = 0; c < C; c++) w[c] += gi[c] * (xi[c] * s);
    }
  }
  add_partials(dweight, pw, nchunks, C, C);
}

}  // namespace cleave::kernels
