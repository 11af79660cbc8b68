// Token (and optional learned position) embedding.
#pragma once
#include <cstdint>

namespace cleave::kernels {

// out[b, t, :] = wte[tokens[b, t], :] + (wpe ? wpe[pos_offset + t, :] : 0)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int C, int64_t pos_offset);
// dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t] (dwpe may be null). Deterministic:
// no atomics; the order of accumulation is fixed.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int C);

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
// Learned positions for n rows that are rows [row0, row0 + n) of sequences of T tokens:
// out[i, :] += wpe[(row0 + i) % T, :]; backward dwpe[(row0 + i) % T] += dout[i], summed in row
// order.
void position_add(float* out, const float* wpe, int64_t n, int64_t row0, int64_t T, int C);
void position_backward(float* dwpe, const float* dout, int64_t n, int64_t row0, int64_t T, int C);

}  // namespace cleave::kernels
