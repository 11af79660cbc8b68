// LayerNorm and RMSNorm over the last dimension of an [N, C] row-major array.
// Conventions for every kernel in this folder: fp32, row-major, OpenMP inside; backward_input ADDS
// into dx (norms sit on the residual stream), backward_weight ADDS into the weight gradients; the
// result never depends on the number of threads (fixed chunking, fixed summation order).
#pragma once
#include <cstdint>

namespace cleave::kernels {

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int C, float eps);
void layernorm_backward_input(float* dx, const float* dout, const float* x, const float* weight,
                              const float* mean, const float* rstd, int64_t N, int C);
void layernorm_backward_weight(float* dweight, float* dbias, const float* dout, const float* x,
                               const float* mean, const float* rstd, int64_t N, int C);

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t N, int C,
                     float eps);
void rmsnorm_backward_input(float* dx, const float* dout, const float* x, const float* weight,
                            const float* rstd, int64_t N, int C);
void rmsnorm_backward_weight(float* dweight, const float* dout, const float* x, const float* rstd,
                             int64_t N, int C);

}  // namespace cleave::kernels
