// Token (and optional learned position) embedding. Every row carries its own position, so a
// batch may hold documents that restart at 0, context-parallel zigzag pieces or serving requests
// at different offsets.
#pragma once
#include <cstdint>

namespace cleave::kernels {

// N rows; positions may be null only when wpe is null. max_pos: wpe's rows.
// out[r, :] = wte[tokens[r], :] + (wpe ? wpe[positions[r], :] : 0)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       const int32_t* positions, int64_t N, int C, int64_t max_pos);
// dwte[tokens[r]] += dout[r]; dwpe[positions[r]] += dout[r] (dwpe may be null). Deterministic:
// no atomics; every table row sums its rows' gradients in row order, whatever the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int C);

}  // namespace cleave::kernels

namespace cleave::kernels {

// Vocabulary-parallel embedding: a rank holds rows [vocab_begin, vocab_begin + rows) of wte.
// out[i, :] = its row of tokens[i] when it holds it, else 0 (the tp ranks' outputs then sum to
// the lookup). backward: dwte[tokens[i] - vocab_begin] += dout[i] for the tokens it holds, in
// token order.
void embedding_lookup_shard(float* out, const int32_t* tokens, const float* wte, int64_t N, int C,
                            int64_t vocab_begin, int64_t rows);
void embedding_backward_shard(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int C, int64_t vocab_begin, int64_t rows);
// The vocabulary-parallel forms' learned positions, for n rows with their positions:
// out[i, :] += wpe[positions[i], :]; backward dwpe[positions[i]] += dout[i], summed in row order.
void position_add(float* out, const float* wpe, const int32_t* positions, int64_t n, int C);
void position_backward(float* dwpe, const float* dout, const int32_t* positions, int64_t n, int C);

}  // namespace cleave::kernels
