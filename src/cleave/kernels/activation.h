// Element-wise activations. backward writes dx (=), it does not accumulate.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

// Where a backward writes its gradient: in fp32, rounded to bf16 (the operand of a bf16 product,
// made in the same pass), or both; at least one.
struct GradOut {
  float* f32 = nullptr;
  bf16* rounded = nullptr;
  GradOut(float* f) : f32(f) {}  // implicit: an fp32 gradient alone, as most callers want
  GradOut(float* f, bf16* r) : f32(f), rounded(r) {}
};

// GELU, tanh approximation (GPT-2's "gelu_new"). The bf16 forward writes the same values rounded:
// a bf16 product's operand made without an fp32 activation.
void gelu_forward(float* out, const float* x, int64_t n);
void gelu_forward(bf16* out, const float* x, int64_t n);
void gelu_backward(GradOut dx, const float* dout, const float* x, int64_t n);

// SwiGLU on a fused [N, 2F] input: columns [0, F) are the gate, [F, 2F) the up projection;
// out[N, F] = silu(gate) * up. backward writes the [N, 2F] gradient.
void swiglu_forward(float* out, const float* gate_up, int64_t N, int F);
void swiglu_forward(bf16* out, const float* gate_up, int64_t N, int F);
void swiglu_backward(GradOut dgate_up, const float* dout, const float* gate_up, int64_t N, int F);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace cleave::kernels
