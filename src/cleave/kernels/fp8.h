// The two FP8 formats of the OCP 8-bit floating point specification (the formats of NVIDIA's
// Transformer Engine and of the MX formats), encoded with round-to-nearest-even and saturation:
//   E4M3 ("E4M3FN"): 4 exponent bits (bias 7), 3 mantissa bits, no infinities, one NaN pattern
//     per sign (S.1111.111); largest 448, smallest subnormal 2^-9. For weights and activations.
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (infinities, NaNs); largest
//     57344, smallest subnormal 2^-16. For gradients.
// A value beyond the largest finite one, infinities included, saturates to it (as Transformer
// Engine's casts do); NaN stays NaN. The issue-20 recipes (per-tensor scales, blockwise and MX
// scaling) build on these; nothing in the model uses them yet.
#pragma once
#include <cstdint>

namespace cleave::kernels {

enum class Fp8Format { e4m3, e5m2 };

float fp8_max(Fp8Format f);                      // 448 or 57344
uint8_t fp8_encode(float x, Fp8Format f);        // round to nearest even, saturating
float fp8_decode(uint8_t code, Fp8Format f);     // exact

// dst[i] = encode(src[i] * scale); dequantize: dst[i] = decode(src[i]) * inv_scale.
void fp8_quantize(uint8_t* dst, const float* src, int64_t n, float scale, Fp8Format f);
void fp8_dequantize(float* dst, const uint8_t* src, int64_t n, float inv_scale, Fp8Format f);
// max |src[i]| over finite and infinite values (NaN ignored): a per-tensor scale's input.
float abs_max(const float* src, int64_t n);

}  // namespace cleave::kernels
