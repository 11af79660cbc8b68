#include "cleave/base/philox.h"

#include <cmath>

namespace cleave {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * c[0];
    const uint64_t p1 = uint64_t(M1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k = {k[0] + W0, k[1] + W1};
  }
  return c;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

static std::array<uint32_t, 4> draw(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

static float to_unit(uint32_t bits) {  // (0, 1]: never 0, so log() is safe
  return (float(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return to_unit(draw(seed, stream, index)[0]);
}

float philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const auto r = draw(seed, stream, index);
  const double u1 = to_unit(r[0]), u2 = to_unit(r[1]);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace cleave
