// fp32 <-> bf16 (round to nearest even; NaN stays NaN).
#pragma once
#include <cstdint>

namespace cleave::kernels {

using bf16 = uint16_t;

void f32_to_bf16(bf16* out, const float* in, int64_t n);
void bf16_to_f32(float* out, const bf16* in, int64_t n);

}  // namespace cleave::kernels
