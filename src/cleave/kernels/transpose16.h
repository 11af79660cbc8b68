// Internal to the kernels: a 16 x 16 fp32 transpose in AVX-512 registers, for packers that turn
// rows into columns (the weight packer's transposed blocks, attention's transposed operands).
#pragma once

// <immintrin.h> through bf16_round.h, which includes it with GCC 12's false AVX-512 warnings off
// (they follow the header's first inclusion in a file).
#include "cleave/base/bf16_round.h"

namespace cleave::kernels {

#ifdef __AVX512F__
// r[j] becomes column j of the 16 x 16 matrix whose row i was r[i].
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  auto lo = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  auto hi = [](__m512 a, __m512 b) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
  };
  // u[4g + k] holds, per 128-bit lane l, columns k + 4l of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = lo(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = hi(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = lo(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = hi(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
    r[k + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[k + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
  }
}
#endif

}  // namespace cleave::kernels
