// Returning a range of a flat buffer's memory to the system (ZeRO-2/3's released gradients and
// parameters): the range reads as zero and takes no memory until written again, when every page
// of it faults in anew. The planner costs those faults at the rate `cleave calibrate` measures
// with this same call (kernels/kernel_rates.h).
#pragma once
#include <cstdint>

namespace cleave {

// Zeroes [begin, end) of the floats at base and returns its whole pages to the system.
void release_range(float* base, int64_t begin, int64_t end);

}  // namespace cleave
