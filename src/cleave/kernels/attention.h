// Causal multi-head attention with grouped-query heads, computed blockwise with an online softmax
// (FlashAttention's recurrence): no T x T matrix is ever materialised; memory is O(block^2) per
// thread. Forward also returns the log-sum-exp of each query row, which backward uses to recompute
// probabilities and which ring attention needs to merge partial results.
//
// Context parallelism splits a sequence over ranks: the query rows may be one range of its tokens
// and the key rows another (q_begin, k_begin, Tk). A rank then runs forward once per key range and
// merges the results with attention_merge; backward, given the merged out and lse, is exact per key
// range, and a caller sums the ranges' contributions with `accumulate`. Packed documents (several
// documents in one sequence) are masked with per-token document ids.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

// Forward visits a sequence's keys in blocks of this many, from its first token: a paged cache
// whose blocks hold a multiple of it gives each query the same sums, in the same order, as the
// keys laid out in one piece.
constexpr int64_t kAttentionKeyBlock = 64;

struct AttentionShape {
  int64_t B = 0, T = 0;   // batch, query rows per sequence
  int n_heads = 0;        // query heads
  int n_kv_heads = 0;     // key/value heads; n_heads % n_kv_heads == 0
  int head_dim = 0;
  // Row layout of q, k, v: token (b, t) of q starts at q + (b*T + t) * q_row_stride and holds
  // n_heads * head_dim floats, head h at column h*head_dim (likewise k and v with n_kv_heads, at
  // row b*Tk + t).
  int64_t q_row_stride = 0, kv_row_stride = 0;

  // The defaults below are causal self-attention over T tokens.
  int64_t Tk = 0;  // key/value rows per sequence; 0: T
  // Query row t is token q_begin + t of its sequence and key row t token k_begin + t; a query sees
  // the keys whose token index is not larger than its own.
  int64_t q_begin = 0, k_begin = 0;
  // Document id of each query row [B*T] and key row [B*Tk], non-decreasing along a sequence (its
  // documents follow each other); a query sees only keys of its own document. Null: one document.
  const int32_t* q_seq = nullptr;
  const int32_t* k_seq = nullptr;

  int64_t keys() const { return Tk > 0 ? Tk : T; }
};

// out: [B, T, n_heads*head_dim] (contiguous); lse: [B, n_heads, T]. Scale is 1/sqrt(head_dim).
// A query row that sees no key gets out = 0 and lse = -inf.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s);

// Inference: a ragged batch of sequences, each attending to its keys and values in a paged cache
// (model/kv_pool.h). Sequence s owns rows [rows[s], rows[s + 1]) of q and out, its tokens past[s],
// past[s] + 1, ...; the keys and values of all its tokens up to the last of these (the new ones
// written already) lie in blocks of block_rows rows, a multiple of kAttentionKeyBlock: token t's
// at row t % block_rows of block blocks[s][t / block_rows]. A block's values are rows; its keys
// are stored transposed, column c of token row i at k[(b * kv_row_stride + c) * block_rows + i],
// so that a decoding query reads each key dimension as a vector over the block's tokens (vLLM
// also lays its key cache out for its kernel). Each query gets bit for bit what
// attention_forward gives it over the same keys laid out in one piece.
struct PagedAttention {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t q_row_stride = 0;
  const float* k = nullptr;  // block b at k + b * block_rows * kv_row_stride, transposed
  const float* v = nullptr;  // block b's rows start at v + b * block_rows * kv_row_stride
  // Or a bf16 cache, laid out the same: each query gets what it gets over fp32 keys and values of
  // the same (rounded) values, bit for bit.
  const bf16* k_bf16 = nullptr;
  const bf16* v_bf16 = nullptr;
  int64_t kv_row_stride = 0, block_rows = 0;
  int64_t sequences = 0;
  const int64_t* rows = nullptr;          // [sequences + 1], non-decreasing from 0
  const int64_t* past = nullptr;          // [sequences]
  const int32_t* const* blocks = nullptr;  // [sequences]: each one's block table
};

// out: [rows, n_heads * head_dim]; lse: [n_heads, rows].
void attention_forward_paged(float* out, float* lse, const float* q, const PagedAttention& p);

// dq, dk, dv are laid out like q, k, v (same row strides) and written (=), or added to (+=) with
// accumulate. dout, out: [B, T, H*hd]. out and lse are those of the whole attention, over all key
// ranges: then dk and dv are exact for this call's key range and dq is its part of the sum. Rows
// with lse = -inf (no key seen) get no gradient.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s, bool accumulate = false);

// Ring attention's merge of two results of forward for the same queries over disjoint key ranges:
// (out_a, lse_a) becomes the result over both, with out_a weighted by exp(lse_a - lse) and out_b
// by exp(lse_b - lse). Layouts as forward's out and lse; uses B, T, n_heads and head_dim of s. A
// side with lse = -inf (no key seen) contributes nothing.
void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                     const AttentionShape& s);

}  // namespace cleave::kernels
