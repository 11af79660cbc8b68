// fp32 <-> bf16. bf16 is the upper half of an fp32; narrowing rounds to nearest, ties to even, by
// adding 0x7FFF plus the lowest kept bit before truncating (overflow correctly rounds to inf).
// NaN is kept a quiet NaN (the add could otherwise carry a NaN's payload into inf).
// Branch-free integer code in fixed blocks: it vectorises, and is thread-count independent.
#include "cleave/kernels/convert.h"

#include <algorithm>
#include <bit>

#include "cleave/base/check.h"

namespace cleave::kernels {
namespace {

constexpr int64_t kBlock = 1 << 14;  // elements per task

inline bf16 to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<bf16>(is_nan ? quiet_nan : rounded);
}

}  // namespace

void f32_to_bf16(bf16* out, const float* in, int64_t n) {
  CLEAVE_CHECK(n >= 0, "f32_to_bf16 n=" << n << " must be >= 0");
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; b++) {
    const int64_t e = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < e; i++) out[i] = to_bf16(in[i]);
  }
}

void bf16_to_f32(float* out, const bf16* in, int64_t n) {
  CLEAVE_CHECK(n >= 0, "bf16_to_f32 n=" << n << " must be >= 0");
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; b++) {
    const int64_t e = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < e; i++)
      out[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
  }
}

}  // namespace cleave::kernels
