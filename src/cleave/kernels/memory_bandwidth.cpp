#include "cleave/kernels/memory_bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

#include <omp.h>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"

namespace cleave {

namespace {

// "32768K" (sysfs cache size) in bytes; 0 if it does not parse.
int64_t parse_size(const std::string& s) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(used);
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return unit.empty() ? v : 0;
}

}  // namespace

int64_t last_level_cache_bytes() {
  int best_level = 0;
  int64_t best = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), size_file(dir + "/size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    if (level >= best_level) best_level = level, best = parse_size(size);
  }
  if (best > 0) return best;
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
    if (const long v = sysconf(name); v > 0) return v;
  return 0;
}

TriadResult measure_triad(int64_t array_bytes, int passes) {
  CLEAVE_CHECK(array_bytes >= 8 && passes >= 1,
               "a triad over " << array_bytes << " bytes, " << passes << " passes");
  const int64_t n = array_bytes / 8;
  Buffer<double> a(n), b(n), c(n);
  double* pa = a.data();
  double* pb = b.data();
  double* pc = c.data();
  // Each thread first touches the part it streams (schedule(static) gives it the same part).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) pa[i] = 0, pb[i] = 1, pc[i] = 2;
  const double s = 3;
  auto pass = [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + s * pc[i];
  };
  pass();
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  CLEAVE_CHECK(pa[n - 1] == 7, "the triad computed " << pa[n - 1] << ", not 1 + 3 x 2");
  TriadResult r;
  r.array_bytes = n * 8;
  r.passes = passes;
  r.threads = omp_get_max_threads();
  r.gbps = 3.0 * double(r.array_bytes) / best * 1e-9;
  return r;
}

}  // namespace cleave
