// Causal multi-head attention with grouped-query heads, computed blockwise with an online softmax
// (FlashAttention's recurrence): no T x T matrix is ever materialised; memory is O(block^2) per
// thread. Forward also returns the log-sum-exp of each query row, which backward uses to recompute
// probabilities and which ring attention needs to merge partial results.
#pragma once
#include <cstdint>

namespace cleave::kernels {

struct AttentionShape {
  int64_t B = 0, T = 0;   // batch, sequence
  int n_heads = 0;        // query heads
  int n_kv_heads = 0;     // key/value heads; n_heads % n_kv_heads == 0
  int head_dim = 0;
  // Row layout of q, k, v: token (b, t) of q starts at q + (b*T + t) * q_row_stride and holds
  // n_heads * head_dim floats, head h at column h*head_dim (likewise k and v with n_kv_heads).
  int64_t q_row_stride = 0, kv_row_stride = 0;
};

// out: [B, T, n_heads*head_dim] (contiguous); lse: [B, n_heads, T]. Scale is 1/sqrt(head_dim).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s);

// Writes (=) dq, dk, dv, laid out like q, k, v (same row strides). dout, out: [B, T, H*hd].
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s);

}  // namespace cleave::kernels
