// Runs of fp32 narrowed to bf16 with the bits of to_bf16 (bf16.h), 16 at a time. to_bf16's
// integer rounding costs about six vector operations per 16 values; where the CPU has AVX-512
// BF16, vcvtneps2bf16 rounds the same way (nearest, ties to even, overflow to inf, NaN to a quiet
// NaN with its sign) in one. It differs on one class of input only: it reads an fp32 subnormal
// as zero, where to_bf16 rounds it. A vector holding one takes the integer path for those lanes,
// so the result is to_bf16's everywhere.
#pragma once
#include <cstdint>

#include "cleave/base/bf16.h"

// GCC 12's AVX-512 intrinsics start from an "undefined" vector that -Wmaybe-uninitialized
// mistakes for a read of an uninitialised variable (GCC bug 105593, fixed in GCC 13); the warning
// comes where they are inlined, so it is off for this whole header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace cleave {

#ifdef __AVX512F__
// to_bf16 on 16 lanes, by integer arithmetic.
inline __m256i bf16_round_int(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// to_bf16 on 16 lanes.
inline __m256i bf16_round(__m512 v) {
#ifdef __AVX512BF16__
  const __m256i fast = (__m256i)_mm512_cvtneps_pbh(v);
  const __m512i u = _mm512_castps_si512(v);
  // Subnormal: exponent field zero, fraction not.
  const __mmask16 subnormal = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007FFFFF)) &
                              _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7F800000));
  if (__builtin_expect(subnormal == 0, 1)) return fast;
  return _mm256_mask_blend_epi16(subnormal, fast, bf16_round_int(v));
#else
  return bf16_round_int(v);
#endif
}
#endif

// out[i] = to_bf16(in[i]) for i < n, on the calling thread.
inline void bf16_round_run(bf16* out, const float* in, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16_round(_mm512_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = to_bf16(in[i]);
}

}  // namespace cleave

#pragma GCC diagnostic pop
