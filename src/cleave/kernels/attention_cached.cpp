#include "cleave/kernels/attention_cached.h"

#include <cmath>
#include <vector>

namespace cleave::kernels {

void attention_cached(float* out, const float* q, int64_t q_row_stride, const float* k_cache,
                      const float* v_cache, int64_t T, int64_t first_pos, int n_heads,
                      int n_kv_heads, int head_dim) {
  const int64_t kv_dim = int64_t(n_kv_heads) * head_dim;
  const int group = n_heads / n_kv_heads;
  const float scale = 1.0f / std::sqrt(float(head_dim));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const int64_t n_keys = first_pos + t + 1;
      const float* qh = q + t * q_row_stride + int64_t(h) * head_dim;
      const int64_t kv_col = int64_t(h / group) * head_dim;
      std::vector<float> p(n_keys);
      float max = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kj = k_cache + j * kv_dim + kv_col;
        float s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += qh[d] * kj[d];
        p[j] = s * scale;
        max = std::max(max, p[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) sum += (p[j] = std::exp(p[j] - max));
      float* o = out + t * int64_t(n_heads) * head_dim + int64_t(h) * head_dim;
      for (int d = 0; d < head_dim; ++d) o[d] = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float w = p[j] / sum;
        const float* vj = v_cache + j * kv_dim + kv_col;
        for (int d = 0; d < head_dim; ++d) o[d] += w * vj[d];
      }
    }
  }
}

}  // namespace cleave::kernels
