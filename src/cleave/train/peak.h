// The peak MFU is quoted against, per rank, and where it came from:
//   measured    the GEMM peak (kernels/gemm_bench.h measure_gemm_peak), measured at this start
//               because the cache had none for this machine, oneDNN version, dtype and threads;
//   cached      the same figure, measured by an earlier start and read from the cache;
//   configured  train.peak_gflops;
//   hardware    the hardware's FMA peak (train.mfu_peak = "hardware"), as vendors quote.
// The hardware peak is reported beside the others, and cached with the GEMM peak.
// The cache is a JSON file ($XDG_CACHE_HOME/cleave/peaks.json, else ~/.cache/cleave/peaks.json),
// one entry per key, replaced atomically; `cleave peak --refresh` measures again.
#pragma once
#include <string>

#include "cleave/kernels/hardware_peak.h"
#include "cleave/kernels/linear.h"

namespace cleave {

enum class PeakSource { measured, cached, configured, hardware };
const char* source_name(PeakSource s);

struct ComputePeak {
  double gflops = 0;  // per rank
  PeakSource source = PeakSource::measured;
  HardwarePeak hardware;
  std::string key;    // the cache entry's key
};

struct PeakRequest {
  Precision precision = Precision::fp32;
  int threads = 1;
  double configured_gflops = 0;  // > 0: use it
  bool hardware = false;         // quote MFU against the hardware peak
  bool refresh = false;          // measure again even if the cache has the figures
  std::string cache_path;        // "" : no cache
};

// The default cache file, or "" when neither XDG_CACHE_HOME nor HOME is set.
std::string default_peak_cache();

// Resolves the peak for this process's machine: from the request, the cache, or by measuring
// (a few seconds; measured figures are written to the cache).
ComputePeak resolve_peak(const PeakRequest& request);

}  // namespace cleave
