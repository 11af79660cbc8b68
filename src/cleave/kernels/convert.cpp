// fp32 <-> bf16 (bf16 is the upper half of an fp32), in fixed blocks: thread-count independent.
#include "cleave/kernels/convert.h"

#include <immintrin.h>

#include <bit>

#include "cleave/base/bf16_round.h"
#include "cleave/kernels/for_blocks.h"

namespace cleave::kernels {
namespace {

constexpr int64_t kBlock = 1 << 14;  // elements per task

}  // namespace

void f32_to_bf16(bf16* out, const float* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) { bf16_round_run(out + b, in + b, e - b); });
}

void bf16_to_f32(float* out, const bf16* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) out[i] = from_bf16(in[i]);
  });
}

void f16_to_f32(float* out, const uint16_t* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) out[i] = float(std::bit_cast<_Float16>(in[i]));
  });
}

void f32_to_f16(uint16_t* out, const float* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) out[i] = std::bit_cast<uint16_t>(_Float16(in[i]));
  });
}

void round_to_bf16(float* out, const float* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) out[i] = from_bf16(to_bf16(in[i]));
  });
}

void round_to_fp16(float* out, const float* in, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    int64_t i = b;
#ifdef __F16C__
    // GCC leaves the scalar loop below unvectorised: 8 at a time through F16C.
    for (; i + 8 <= e; i += 8) {
      const __m128i half =
          _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
    }
#endif
    for (; i < e; i++) out[i] = float(_Float16(in[i]));
  });
}

}  // namespace cleave::kernels
