// fp32 <-> bf16 (round to nearest even; NaN stays NaN).
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

using cleave::bf16;

void f32_to_bf16(bf16* out, const float* in, int64_t n);
void bf16_to_f32(float* out, const bf16* in, int64_t n);

}  // namespace cleave::kernels
