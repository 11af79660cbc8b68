// fp32 <-> bf16 (round to nearest even; NaN stays NaN), fp16 widened to fp32, and fp32 rounded to
// fp16's or bf16's values.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

using cleave::bf16;

void f32_to_bf16(bf16* out, const float* in, int64_t n);
void bf16_to_f32(float* out, const bf16* in, int64_t n);
// IEEE half precision (its bits, as safetensors' F16 stores them) widened to fp32: exact.
void f16_to_f32(float* out, const uint16_t* in, int64_t n);
// fp32 narrowed to IEEE half precision's bits, rounded as round_to_fp16 rounds.
void f32_to_f16(uint16_t* out, const float* in, int64_t n);

// Each value rounded to the nearest fp16 (ties to even), kept as fp32: beyond fp16's largest
// (65504) it becomes +-inf, below its smallest subnormal (2^-24) 0, as a cast to fp16 would. The
// operands of an fp16 product with fp32 accumulation, every one exact in fp32, for a CPU whose
// oneDNN has no fp16 matmul.
void round_to_fp16(float* out, const float* in, int64_t n);
// Each value rounded to the nearest bf16 (as f32_to_bf16 rounds), kept as fp32: the weight of a
// bf16 product emulated in fp32 on a CPU whose oneDNN has no bf16 matmul.
void round_to_bf16(float* out, const float* in, int64_t n);

}  // namespace cleave::kernels
