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
