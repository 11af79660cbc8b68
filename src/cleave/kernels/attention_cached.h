// Attention of new query tokens against a key/value cache, for generation: query token t sits at
// position first_pos + t and sees cached positions [0, first_pos + t]. One sequence; GQA as in
// attention.h. Computed directly (generation touches one token at a time).
#pragma once
#include <cstdint>

namespace cleave::kernels {

// q: [T, q_row_stride] (heads at column 0); k_cache, v_cache: [positions, n_kv_heads*head_dim];
// out: [T, n_heads*head_dim].
void attention_cached(float* out, const float* q, int64_t q_row_stride, const float* k_cache,
                      const float* v_cache, int64_t T, int64_t first_pos, int n_heads,
                      int n_kv_heads, int head_dim);

}  // namespace cleave::kernels
