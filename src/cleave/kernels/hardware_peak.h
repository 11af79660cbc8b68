// The hardware's floating-point peak for a dtype and thread count: cores x frequency x FLOPs per
// cycle, next to which the measured GEMM peak (gemm_bench.h) can be judged. The FMA rate is
// measured with the widest FMA instruction the CPU has (AVX-512 or AVX2 FMA for fp32, the AVX-512
// BF16 dot product for bf16), each thread timing its own bursts by its CPU time, so neighbours
// that take the cores away lengthen the wall time but not the figure. Intel's AMX has no loop
// here: its bf16 rate is derived from the measured clock and AMX's 1024 FLOPs per cycle.
#pragma once
#include <string>

#include "cleave/kernels/linear.h"

namespace cleave {

struct HardwarePeak {
  double gflops = 0;           // threads x ghz x flops_per_cycle; 0 when not known (non-x86)
  double ghz = 0;              // the clock under this load: the FMA rate over the nominal rate
                               // (0: unknown)
  double flops_per_cycle = 0;  // per core, for the instruction below (nominal: a power of two;
                               // 0: unknown)
  int threads = 0;
  std::string instruction;     // e.g. "AVX-512 FMA", "AVX-512 BF16 dot product", "AMX"
  bool derived = false;        // true: computed from the clock (AMX), not timed
};

// The clock (and with it FLOPs per cycle, and AMX's derived peak) is measured by a dependent
// multiply chain and believed only within [kMinPlausibleGhz, kMaxPlausibleGhz]; outside it they
// stay 0 ("unknown"), and a timed FMA rate is still given.
constexpr double kMinPlausibleGhz = 0.4, kMaxPlausibleGhz = 6.5;
bool plausible_clock(double ghz);
HardwarePeak measure_hardware_peak(Precision precision, int threads);

// The value of the first /proc/cpuinfo line that starts with key ("model name", "flags"), or "".
std::string cpu_info(const std::string& key);

// The instruction set oneDNN's kernels use on this CPU, by oneDNN's name ("avx2",
// "avx512_core_bf16", "avx512_core_amx", ...): what a measured GEMM rate holds for.
std::string onednn_isa();

// "17 GF/s: 2 threads x 3.70 GHz x 32 FLOP/cycle (AVX-512 FMA, measured)", or with the clock
// unknown "236 GF/s on 2 threads (AVX-512 FMA, measured; clock unknown)"
std::string describe(const HardwarePeak& peak);

}  // namespace cleave
