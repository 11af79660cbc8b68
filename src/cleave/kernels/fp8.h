// The two FP8 formats of the OCP 8-bit floating point specification (the formats of NVIDIA's
// Transformer Engine and of the MX formats), encoded with round-to-nearest-even and saturation:
//   E4M3 ("E4M3FN"): 4 exponent bits (bias 7), 3 mantissa bits, no infinities, one NaN pattern
//     per sign (S.1111.111); largest 448, smallest subnormal 2^-9. For weights and activations.
//   E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (infinities, NaNs); largest
//     57344, smallest subnormal 2^-16. For gradients.
// A value beyond the largest finite one, infinities included, saturates to it (as Transformer
// Engine's casts do); NaN stays NaN.
//
// Scaling (docs/precision.md#fp8): a tensor is quantised as encode(x * scale) and read back as
// decode(code) * factor, factor = 1 / scale. Per-tensor recipes take one scale for the whole
// tensor; the tile recipes one per tile of tile_rows x tile_cols elements (ragged at the edges),
// a power of two, so that every dequantised value is exact in bf16.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

namespace cleave::kernels {

enum class Fp8Format { e4m3, e5m2 };

// How scales are chosen (Transformer Engine's recipes of the same names):
//   delayed:   per tensor, from the largest magnitude over a history of earlier steps
//   current:   per tensor, from this tensor's own largest magnitude
//   blockwise: 1 x 128 tiles of activations and gradients, 128 x 128 blocks of weights, power
//              of two scales (DeepSeek-V3's layout; TE's Float8BlockScaling)
//   mxfp8:     1 x 32 tiles along the product's inner dimension with E8M0 (power of two)
//              scales: the OCP Microscaling format
enum class Fp8Recipe { delayed, current, blockwise, mxfp8 };

float fp8_max(Fp8Format f);                      // 448 or 57344
uint8_t fp8_encode(float x, Fp8Format f);        // round to nearest even, saturating
float fp8_decode(uint8_t code, Fp8Format f);     // exact

// dst[i] = encode(src[i] * scale); dequantize: dst[i] = decode(src[i]) * inv_scale.
void fp8_quantize(uint8_t* dst, const float* src, int64_t n, float scale, Fp8Format f);
void fp8_dequantize(float* dst, const uint8_t* src, int64_t n, float inv_scale, Fp8Format f);
// max |src[i]| over finite and infinite values (NaN ignored): a per-tensor scale's input.
float abs_max(const float* src, int64_t n);

// A per-tensor scale from an amax: fp8_max / amax / 2^margin (Transformer Engine's rule); an amax
// of 0 or one that is not finite keeps `previous`.
float fp8_scale(float amax, Fp8Format f, int margin, float previous);

// The power of two whose product with a tile's largest magnitude amax is at most fp8_max (the
// tile's scale; amax 0 gives 1), its exponent clamped to E8M0's range [-127, 127].
float fp8_tile_scale(float amax, Fp8Format f);

// A tile layout of a [rows, cols] row-major matrix: tiles of tile_rows x tile_cols, row-major,
// the last row and column of tiles ragged.
struct Fp8Tiles {
  int64_t rows, cols, tile_rows, tile_cols;
  int64_t tiles_down() const { return (rows + tile_rows - 1) / tile_rows; }
  int64_t tiles_across() const { return (cols + tile_cols - 1) / tile_cols; }
  int64_t count() const { return tiles_down() * tiles_across(); }
  static Fp8Tiles whole(int64_t rows, int64_t cols) { return {rows, cols, rows, cols}; }
};

// Quantises src tile by tile, each with its fp8_tile_scale; factors[t] = 1 / that scale.
void fp8_quantize_tiles(uint8_t* dst, float* factors, const float* src, const Fp8Tiles& t,
                        Fp8Format f);
// decode(code) * factors[tile] for every element, as bf16 or fp32: exact when the factors are
// powers of two (or 1).
void fp8_image(bf16* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t,
               Fp8Format f);
void fp8_image(float* dst, const uint8_t* src, const float* factors, const Fp8Tiles& t,
               Fp8Format f);

}  // namespace cleave::kernels
