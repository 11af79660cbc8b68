// Fused softmax cross-entropy: loss and (optionally) dlogits in place, one row at a time.
//
// Each row is read from memory once and, with a gradient, written once: the sweeps after the
// first find the row in L1/L2 (V = 50k floats is 200 KB). Per row:
//   1. M = max_j x[j];
//   2. S = sum_j exp(x[j] - M), storing each exp(x[j] - M) back into the row when a gradient is
//      wanted (loss = log S + M - x[t], with x[t] read first);
//   3. x[j] *= grad_scale / S, then x[t] -= grad_scale.
// This costs one exp per logit. (An online max/sum-exp would make step 1 unnecessary but, to
// rescale the running sum and then recompute the softmax, pays more than two exps per logit,
// and the exps, not memory, are the bottleneck: it measured ~1.6x slower with a gradient.)
// Working relative to M, a logit, rather than a rounded lse keeps softmax accurate to a few ulp
// even when the logits are large.
// Sums use kLanes accumulators added in a fixed order; rows are independent and split among
// threads, so nothing depends on the thread count.
#include "cleave/kernels/cross_entropy.h"

#include <cmath>
#include <cstring>

#include "cleave/base/check.h"
#include "cleave/kernels/vmath.h"

namespace cleave::kernels {
namespace {

constexpr int kLanes = 16;  // one AVX-512 register of floats

// kLanes floats as one vector (GCC vector extension): g++ turns a scalar max loop into branches.
using vfloat = float __attribute__((vector_size(kLanes * sizeof(float))));

inline float fmax2(float a, float b) { return a > b ? a : b; }

// max_j x[j]. NaNs are skipped here; they still reach the loss through the exp sum.
float row_max(const float* x, int V) {
  int j = 0;
  float M = x[0];
  if (V >= kLanes) {
    vfloat m;
    std::memcpy(&m, x, sizeof m);
    for (j = kLanes; j + kLanes <= V; j += kLanes) {
      vfloat v;
      std::memcpy(&v, x + j, sizeof v);
      m = v > m ? v : m;
    }
    for (int l = 0; l < kLanes; l++) M = fmax2(M, m[l]);
  }
  for (; j < V; j++) M = fmax2(M, x[j]);
  return M;
}

// sum_j exp(x[j] - M); when store, x[j] becomes exp(x[j] - M).
template <bool store>
float row_sumexp(float* x, float M, int V) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; l++) {
      const float e = vmath::exp_f(x[j + l] - M);
      if (store) x[j + l] = e;
      acc[l] += e;
    }
  float S = 0.0f;
  for (int l = 0; l < kLanes; l++) S += acc[l];
  for (; j < V; j++) {
    const float e = vmath::exp_f(x[j] - M);
    if (store) x[j] = e;
    S += e;
  }
  return S;
}

}  // namespace

void cross_entropy_forward_backward(float* logits, float* losses, const int32_t* targets, int64_t N,
                                    int V, float grad_scale) {
  CLEAVE_CHECK(N >= 0, "cross_entropy N=" << N << " must be >= 0");
  CLEAVE_CHECK(V > 0, "cross_entropy V=" << V << " must be > 0");
  // Validate up front: an exception must not escape an OpenMP region.
  for (int64_t i = 0; i < N; i++)
    CLEAVE_CHECK(targets[i] >= 0 && targets[i] < V,
                 "cross_entropy target of row " << i << " is " << targets[i] << ", outside [0, "
                                                << V << ")");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    float* x = logits + i * static_cast<int64_t>(V);
    const int t = targets[i];
    const float xt = x[t];
    const float M = row_max(x, V);
    const float S = grad_scale != 0.0f ? row_sumexp<true>(x, M, V) : row_sumexp<false>(x, M, V);
    // M - x[t] first: it is exact when the two are close.
    losses[i] = static_cast<float>(std::log(static_cast<double>(S)) + static_cast<double>(M - xt));
    if (grad_scale != 0.0f) {
      const float scale = grad_scale / S;
      for (int j = 0; j < V; j++) x[j] *= scale;
      x[t] -= grad_scale;
    }
  }
}

}  // namespace cleave::kernels

namespace cleave::kernels {

void vocab_shard_stats(const float* logits, float* stats, const int32_t* targets, int64_t N, int V,
                       int64_t stride, int64_t vocab_begin) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* x = logits + i * stride;
    const int64_t t = int64_t(targets[i]) - vocab_begin;
    float* s = stats + 3 * i;
    if (V == 0) {
      s[0] = -INFINITY, s[1] = 0.0f, s[2] = 0.0f;
      continue;
    }
    const float M = row_max(x, V);
    s[0] = M;
    s[1] = row_sumexp<false>(const_cast<float*>(x), M, V);
    s[2] = t >= 0 && t < V ? x[t] : 0.0f;
  }
}

void vocab_shard_loss(float* logits, float* losses, const float* all_stats, int ranks,
                      const int32_t* targets, int64_t N, int V, int64_t stride,
                      int64_t vocab_begin, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    float M = -INFINITY, xt = 0.0f;
    for (int r = 0; r < ranks; r++) {
      M = fmax2(M, all_stats[(r * N + i) * 3]);
      xt += all_stats[(r * N + i) * 3 + 2];  // one rank holds the target, the others add 0
    }
    float S = 0.0f;
    for (int r = 0; r < ranks; r++) {
      const float* s = all_stats + (r * N + i) * 3;
      if (s[1] > 0.0f) S += s[1] * vmath::exp_f(s[0] - M);
    }
    losses[i] = static_cast<float>(std::log(static_cast<double>(S)) + static_cast<double>(M - xt));
    if (grad_scale == 0.0f) continue;
    float* x = logits + i * stride;
    const float scale = grad_scale / S;
    for (int j = 0; j < V; j++) x[j] = vmath::exp_f(x[j] - M) * scale;
    for (int64_t j = V; j < stride; j++) x[j] = 0.0f;
    const int64_t t = int64_t(targets[i]) - vocab_begin;
    if (t >= 0 && t < V) x[t] -= grad_scale;
  }
}

}  // namespace cleave::kernels
