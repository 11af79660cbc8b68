// The global L2 norm of the gradients, summed in a fixed order (fixed chunks, double partials),
// so it is bitwise reproducible and independent of the thread count.
#pragma once
#include <cstdint>

namespace cleave {

double sum_of_squares(const float* x, int64_t n);

}  // namespace cleave
