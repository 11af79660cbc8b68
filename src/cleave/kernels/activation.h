// Element-wise activations. backward writes dx (=), it does not accumulate.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

// GELU, tanh approximation (GPT-2's "gelu_new"). The bf16 forms write the same values rounded:
// a bf16 product's operand made without an fp32 activation or gradient.
void gelu_forward(float* out, const float* x, int64_t n);
void gelu_forward(bf16* out, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n);
void gelu_backward(bf16* dx, const float* dout, const float* x, int64_t n);
// The bf16 backward of x [N, F] for a product whose weight has a bias (GPT-2's fc): also adds
// the columns of the fp32 gradient to dbias in the same pass, with the bits LinearGemm's bias
// gradient gets from the fp32 gradient (kernels/column_sums.h). No fp32 gradient is written.
void gelu_backward_bias(bf16* dx, float* dbias, const float* dout, const float* x, int64_t N, int F);

// SwiGLU on a fused [N, 2F] input: columns [0, F) are the gate, [F, 2F) the up projection;
// out[N, F] = silu(gate) * up. backward writes the [N, 2F] gradient.
void swiglu_forward(float* out, const float* gate_up, int64_t N, int F);
void swiglu_forward(bf16* out, const float* gate_up, int64_t N, int F);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F);
void swiglu_backward(bf16* dgate_up, const float* dout, const float* gate_up, int64_t N, int F);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace cleave::kernels
