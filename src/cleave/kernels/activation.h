// Element-wise activations. backward writes dx (=), it does not accumulate.
#pragma once
#include <cstdint>

namespace cleave::kernels {

// GELU, tanh approximation (GPT-2's "gelu_new").
void gelu_forward(float* out, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n);

// SwiGLU on a fused [N, 2F] input: columns [0, F) are the gate, [F, 2F) the up projection;
// out[N, F] = silu(gate) * up. backward writes the [N, 2F] gradient.
void swiglu_forward(float* out, const float* gate_up, int64_t N, int F);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace cleave::kernels
