// Internal to the kernels: a flat loop over [0, n) cut into fixed blocks of `Block` elements,
// shared among threads. Which elements a block holds (and so whether one lands in a vector body
// or a remainder loop) depends only on n, never on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cleave/base/check.h"

namespace cleave::kernels {

// Calls body(begin, end) on consecutive blocks of [0, n), in parallel.
template <int64_t Block, class Body>
void for_blocks(int64_t n, Body body) {
  CLEAVE_CHECK(n >= 0, "n=" << n << " must be >= 0");
  const int64_t nblocks = (n + Block - 1) / Block;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; b++) body(b * Block, std::min(n, (b + 1) * Block));
}

}  // namespace cleave::kernels
