#include "cleave/kernels/moe_router.h"

#include <cmath>
#include <vector>

namespace cleave::kernels {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// p = softmax(l) over E.
void softmax(const float* l, int E, float* p) {
  float m = l[0];
  for (int e = 1; e < E; ++e) m = std::fmax(m, l[e]);
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - m);
  for (int e = 0; e < E; ++e) p[e] /= sum;
}

// The k largest of key, in descending order, ties to the lower index.
void top_k(const float* key, int E, int k, int32_t* out) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int m = 0; m < j && !taken; ++m) taken = out[m] == e;
      if (!taken && (best < 0 || key[e] > key[best])) best = e;
    }
    out[j] = best;
  }
}

}  // namespace

void route_forward(MoeRouter router, const float* logits, const float* bias, int64_t N, int E,
                   int k, int32_t* choice, float* gate, float* probs) {
#pragma omp parallel
  {
    std::vector<float> key(size_t(E), 0.0f);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* l = logits + i * E;
      float* p = probs + i * E;
      int32_t* c = choice + i * k;
      float* g = gate + i * k;
      if (router == MoeRouter::sigmoid_bias) {
        float total = 0;
        for (int e = 0; e < E; ++e) {
          const float s = sigmoid(l[e]);
          key[size_t(e)] = s + (bias ? bias[e] : 0.0f);
          total += p[e] = s;
        }
        for (int e = 0; e < E; ++e) p[e] /= total;
        top_k(key.data(), E, k, c);
        float chosen = 0;
        for (int j = 0; j < k; ++j) chosen += g[j] = sigmoid(l[c[j]]);
        for (int j = 0; j < k; ++j) g[j] /= chosen;
        continue;
      }
      softmax(l, E, p);
      top_k(l, E, k, c);  // softmax keeps the logits' order
      if (router == MoeRouter::softmax_topk) {
        for (int j = 0; j < k; ++j) g[j] = p[c[j]];
        continue;
      }
      const float m = l[c[0]];
      float sum = 0;
      for (int j = 0; j < k; ++j) sum += g[j] = std::exp(l[c[j]] - m);
      for (int j = 0; j < k; ++j) g[j] /= sum;
    }
  }
}

void route_backward(MoeRouter router, const float* logits, const int32_t* choice,
                    const float* gate, const float* d_gate, const float* d_probs, int64_t N,
                    int E, int k, float* d_logits) {
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* l = logits + i * E;
      const int32_t* c = choice + i * k;
      const float* g = gate + i * k;
      const float* dg = d_gate + i * k;
      const float* dpr = d_probs ? d_probs + i * E : nullptr;
      float* dl = d_logits + i * E;
      for (int e = 0; e < E; ++e) dl[e] = 0, dp[size_t(e)] = dpr ? dpr[e] : 0.0f;
      if (router == MoeRouter::sigmoid_bias) {
        // ds from the normalised gates and the normalised scores, then through the sigmoid.
        float total = 0, chosen = 0, gdg = 0;
        for (int e = 0; e < E; ++e) total += p[size_t(e)] = sigmoid(l[e]);
        for (int j = 0; j < k; ++j) chosen += p[size_t(c[j])], gdg += g[j] * dg[j];
        float pdp = 0;
        for (int e = 0; e < E; ++e) pdp += p[size_t(e)] / total * dp[size_t(e)];
        for (int e = 0; e < E; ++e) dl[e] = (dp[size_t(e)] - pdp) / total;
        for (int j = 0; j < k; ++j) dl[c[j]] += (dg[j] - gdg) / chosen;
        for (int e = 0; e < E; ++e) dl[e] *= p[size_t(e)] * (1.0f - p[size_t(e)]);
        continue;
      }
      softmax(l, E, p.data());
      if (router == MoeRouter::softmax_topk)
        for (int j = 0; j < k; ++j) dp[size_t(c[j])] += dg[j];
      float pdp = 0;
      for (int e = 0; e < E; ++e) pdp += p[size_t(e)] * dp[size_t(e)];
      for (int e = 0; e < E; ++e) dl[e] = p[size_t(e)] * (dp[size_t(e)] - pdp);
      if (router == MoeRouter::topk_softmax) {
        float gdg = 0;
        for (int j = 0; j < k; ++j) gdg += g[j] * dg[j];
        for (int j = 0; j < k; ++j) dl[c[j]] += g[j] * (dg[j] - gdg);
      }
    }
  }
}

double router_z_loss(const float* logits, int64_t N, int E, float scale, float* d_logits) {
  double sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (int64_t i = 0; i < N; ++i) {
    const float* l = logits + i * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::fmax(m, l[e]);
    float s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
    const float lse = m + std::log(s);
    sum += double(lse) * lse;
    if (scale == 0) continue;
    float* dl = d_logits + i * E;
    for (int e = 0; e < E; ++e) dl[e] += scale * 2.0f * lse * std::exp(l[e] - m) / s;
  }
  return sum;
}

}  // namespace cleave::kernels
