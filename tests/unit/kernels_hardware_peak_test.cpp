// The hardware peak tells the truth or says it does not know: a clock it gives is plausible and,
// with the FLOPs per cycle (a power of two), makes up the measured rate; a clock it cannot believe
// leaves the clock, the FLOPs per cycle and AMX's derived peak unknown, and the text says so.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cleave/kernels/hardware_peak.h"

using cleave::HardwarePeak;

TEST(HardwarePeak, AClockGivenIsPlausibleAndMakesUpTheRate) {
#if defined(__x86_64__)
  for (cleave::Precision p : {cleave::Precision::fp32, cleave::Precision::bf16}) {
    const HardwarePeak h = cleave::measure_hardware_peak(p, 1);
    if (h.instruction.empty()) continue;  // no FMA instruction this build knows
    if (h.ghz <= 0) {
      EXPECT_EQ(h.flops_per_cycle, 0.0) << h.instruction;
      continue;
    }
    EXPECT_TRUE(cleave::plausible_clock(h.ghz)) << h.ghz << " GHz";
    EXPECT_EQ(std::exp2(std::round(std::log2(h.flops_per_cycle))), h.flops_per_cycle);
    EXPECT_NEAR(h.threads * h.ghz * h.flops_per_cycle, h.gflops, 1e-6 * h.gflops);
  }
#endif
}

TEST(HardwarePeak, ImplausibleClocksAreNotBelieved) {
  EXPECT_FALSE(cleave::plausible_clock(20.12));  // the add chain's reading on Golden Cove
  EXPECT_FALSE(cleave::plausible_clock(0.05));
  EXPECT_TRUE(cleave::plausible_clock(3.1));
}

TEST(HardwarePeak, UnknownIsSaid) {
  HardwarePeak fma;
  fma.gflops = 236;
  fma.threads = 2;
  fma.instruction = "AVX-512 FMA";
  EXPECT_EQ(cleave::describe(fma), "236 GF/s on 2 threads (AVX-512 FMA, measured; clock unknown)");
  HardwarePeak amx;
  amx.threads = 2;
  amx.instruction = "AMX";
  amx.derived = true;
  EXPECT_EQ(cleave::describe(amx), "unknown (AMX: the clock is unknown)");
  EXPECT_EQ(cleave::describe(HardwarePeak{}), "unknown on this CPU");
}
