#include "cleave/kernels/hardware_peak.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from an "undefined" vector that -Wmaybe-uninitialized
// mistakes for a read of an uninitialised variable (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace cleave {

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

bool cpu_has(const std::string& flag) {
  std::istringstream words(cpu_info("flags"));
  std::string w;
  while (words >> w)
    if (w == flag) return true;
  return false;
}

#if defined(__x86_64__)
// Each loop runs independent accumulators (more than FMA latency x ports), so the FMA pipes, not
// the dependency chains, set the rate. a = a * b + c converges to a fixed point near 1: no
// overflow, no denormals. Returns the FLOPs done; the sum, stored in g_sink, keeps the work alive.
constexpr int kChains = 12;
std::atomic<float> g_sink{0};

__attribute__((target("avx512f"))) double fma_avx512(int64_t iters) {
  __m512 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_set1_ps(1.0f + 0.01f * float(j));
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_fmadd_ps(a[j], b, c);
  __m512 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, a[j]);
  g_sink.store(_mm512_reduce_add_ps(s), std::memory_order_relaxed);
  return double(iters) * kChains * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fma_avx2(int64_t iters) {
  __m256 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm256_set1_ps(1.0f + 0.01f * float(j));
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm256_fmadd_ps(a[j], b, c);
  alignas(32) float out[8];
  __m256 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm256_add_ps(s, a[j]);
  _mm256_store_ps(out, s);
  g_sink.store(out[0] + out[7], std::memory_order_relaxed);
  return double(iters) * kChains * 8 * 2;
}

// vdpbf16ps: 16 lanes, each a sum of two bf16 products added to an fp32 accumulator (4 FLOPs).
__attribute__((target("avx512f,avx512bf16"))) double dot_bf16(int64_t iters) {
  __m512 a[kChains];
  for (int j = 0; j < kChains; ++j) a[j] = _mm512_setzero_ps();
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.5f));
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) a[j] = _mm512_dpbf16_ps(a[j], x, y);
  __m512 s = a[0];
  for (int j = 1; j < kChains; ++j) s = _mm512_add_ps(s, a[j]);
  g_sink.store(_mm512_reduce_add_ps(s), std::memory_order_relaxed);
  return double(iters) * kChains * 16 * 4;
}

// A chain of dependent 64-bit multiplies, each 3 cycles on every x86 core of our kinds (Intel
// since Nehalem, AMD since Zen): three times the multiplies per CPU second is the clock. A chain of
// adds of an immediate is no clock: Golden Cove's renamer folds them, and it read 20 GHz there.
double multiply_chain_cycles(int64_t iters) {
  uint64_t x = 3, m = 5;
  for (int64_t i = 0; i < iters; ++i)
    asm volatile(
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0"
        : "+r"(x)
        : "r"(m));
  return double(iters) * 8 * 3;
}
#endif

using Loop = double (*)(int64_t);

// The best rate (operations per CPU second) of `bursts` bursts of `iters` iterations on each of
// `threads` threads, summed over the threads; a first burst warms the core up untimed.
double best_rate(const std::function<double(int64_t)>& burst, int threads, int64_t iters,
                 int bursts) {
  std::vector<double> best(size_t(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    burst(iters);
    for (int b = 0; b < bursts; ++b) {
      const double t0 = thread_cpu_seconds();
      const double ops = burst(iters);
      const double dt = thread_cpu_seconds() - t0;
      if (dt > 0) best[size_t(t)] = std::max(best[size_t(t)], ops / dt);
    }
  }
  double sum = 0;
  for (double r : best) sum += r;
  return sum;
}

}  // namespace

std::string cpu_info(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.rfind(key, 0) != 0) continue;
    const size_t value = line.find_first_not_of(" \t", colon + 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

std::string onednn_isa() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::all: return "all";
    case cpu_isa::sse41: return "sse41";
    case cpu_isa::avx: return "avx";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx2_vnni: return "avx2_vnni";
    case cpu_isa::avx512_mic: return "avx512_mic";
    case cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case cpu_isa::avx512_core: return "avx512_core";
    case cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: break;  // a later oneDNN's
  }
  char code[32];
  std::snprintf(code, sizeof code, "isa 0x%x", unsigned(dnnl::get_effective_cpu_isa()));
  return code;
}

bool plausible_clock(double ghz) { return ghz >= kMinPlausibleGhz && ghz <= kMaxPlausibleGhz; }

HardwarePeak measure_hardware_peak(Precision precision, int threads) {
  HardwarePeak p;
  p.threads = threads;
#if defined(__x86_64__)
  const double ghz =
      best_rate([](int64_t n) { return multiply_chain_cycles(n); }, 1, 1 << 15, 200) * 1e-9;
  if (precision == Precision::bf16 && cpu_has("amx_bf16")) {
    p.instruction = "AMX";
    p.derived = true;
    if (!plausible_clock(ghz)) return p;  // unknown: nothing is derived from a clock not believed
    p.flops_per_cycle = 1024;
    p.ghz = ghz;
    p.gflops = threads * ghz * p.flops_per_cycle;
    return p;
  }
  Loop loop = nullptr;
  if (precision == Precision::bf16 && cpu_has("avx512_bf16")) {
    loop = dot_bf16;
    p.instruction = "AVX-512 BF16 dot product";
  } else if (cpu_has("avx512f")) {
    loop = fma_avx512;
    p.instruction = "AVX-512 FMA";
  } else if (cpu_has("fma")) {
    loop = fma_avx2;
    p.instruction = "AVX2 FMA";
  }
  if (!loop) return p;
  const double flops_per_s = best_rate([&](int64_t n) { return loop(n); }, threads, 1 << 18, 200);
  p.gflops = flops_per_s * 1e-9;  // measured, whatever the clock says
  if (!plausible_clock(ghz)) return p;
  // The nominal FLOPs per cycle is a power of two; the clock under FMA load (which may run below
  // the integer clock) is what makes threads x GHz x FLOPs/cycle equal the measured rate. A
  // split that needs a clock beyond belief is none: the clock and FLOPs per cycle stay unknown.
  const double per_cycle = std::exp2(std::round(std::log2(flops_per_s / (threads * ghz * 1e9))));
  const double fma_ghz = flops_per_s / (threads * per_cycle) * 1e-9;
  if (!plausible_clock(fma_ghz)) return p;
  p.flops_per_cycle = per_cycle;
  p.ghz = fma_ghz;
#else
  (void)precision;
#endif
  return p;
}

std::string describe(const HardwarePeak& peak) {
  if (peak.gflops <= 0)
    return peak.instruction.empty() ? "unknown on this CPU"
                                    : "unknown (" + peak.instruction + ": the clock is unknown)";
  char buf[160];
  if (peak.ghz <= 0) {
    std::snprintf(buf, sizeof buf, "%.0f GF/s on %d thread%s (%s, measured; clock unknown)",
                  peak.gflops, peak.threads, peak.threads == 1 ? "" : "s",
                  peak.instruction.c_str());
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.0f GF/s: %d thread%s x %.2f GHz x %.0f FLOP/cycle (%s, %s)",
                peak.gflops, peak.threads, peak.threads == 1 ? "" : "s", peak.ghz,
                peak.flops_per_cycle, peak.instruction.c_str(),
                peak.derived ? "derived from the clock" : "measured");
  return buf;
}

}  // namespace cleave
