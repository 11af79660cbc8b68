// The streaming bandwidth of this process's memory, as the element-wise kernels of a step (norms,
// activations, the optimizer) see it: STREAM's triad a[i] = b[i] + s * c[i] over three arrays of
// doubles, each larger than the last-level cache, split over the OpenMP team (each thread writes
// its part first, so its pages are local to it). Bytes are counted as STREAM counts them: two
// arrays read and one written per pass (the write-allocate read of `a` is not counted, so the
// figure is what a kernel moving those bytes achieves).
#pragma once
#include <cstdint>

namespace cleave {

// The largest cache level's size in bytes (sysfs, else sysconf), or 0 when neither says.
int64_t last_level_cache_bytes();

struct TriadResult {
  double gbps = 0;            // of the fastest pass: GB/s (1e9 bytes/s)
  int64_t array_bytes = 0;    // each of the three arrays
  int passes = 0;
  int threads = 0;
};

// Times `passes` triad passes (after one untimed pass) over arrays of array_bytes each.
TriadResult measure_triad(int64_t array_bytes, int passes);

}  // namespace cleave
