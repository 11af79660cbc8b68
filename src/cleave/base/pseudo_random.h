// Fixed pseudo-random test data: the benches' operands and the kernels' one-time checks on
// made-up inputs (kernels/linear.cpp's row tiles), the same values on every machine and run.
#pragma once
#include <cstdint>
#include <vector>

namespace cleave {

// Values in [-scale/2, scale/2) from `seed`, by a linear congruential generator.
inline void fill_pseudo_random(std::vector<float>& v, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 1;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = scale * (float(s >> 8) * (1.0f / 16777216.0f) - 0.5f);
  }
}

}  // namespace cleave
