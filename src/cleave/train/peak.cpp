#include "cleave/train/peak.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/kernels/gemm_bench.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

// At most this long measuring the GEMM peak (typically 2 to 4 s: it stops once stable).
constexpr double kGemmPeakSeconds = 8.0;

std::string cache_key(Precision precision, int threads) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string cpu = cpu_info("model name");
  if (cpu.empty()) cpu = "unknown CPU";
  const dnnl_version_t* v = dnnl_version();
  // v2: the clock from a multiply chain, checked (the add chain's AMX peaks were 10x too high).
  return "v2;host=" + std::string(host) + ";cpu=" + cpu + ";onednn=" +
         std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ";dtype=" + precision_name(precision) +
         ";threads=" + std::to_string(threads);
}

nlohmann::json read_cache(const std::string& path) {
  if (path.empty() || !fs::exists(path)) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(read_bounded_file(path, "the peak cache", 16 * kMiB));
    if (j.is_object()) return j;
  } catch (const std::exception&) {  // not JSON, or not a readable file of a sane size
  }
  std::fprintf(stderr, "cleave: warning: the peak cache %s is not a JSON object; measuring again "
                       "and rewriting it\n", path.c_str());
  return nlohmann::json::object();
}

// Another start may write the cache at the same time: each writes a whole file and renames it
// into place, so a reader sees one complete version (an entry of the other may be lost and is
// then measured again).
void write_cache(const std::string& path, const nlohmann::json& cache) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  try {
    write_file_atomic(path, cache.dump(2) + "\n", "the peak cache");
  } catch (const Error& e) {  // the peak is then measured again at the next start
    std::fprintf(stderr, "cleave: warning: cannot write %s\n", e.what());
  }
}

nlohmann::json to_json(const HardwarePeak& h) {
  return {{"gflops", h.gflops}, {"ghz", h.ghz}, {"flops_per_cycle", h.flops_per_cycle},
          {"threads", h.threads}, {"instruction", h.instruction}, {"derived", h.derived}};
}

HardwarePeak hardware_from(const nlohmann::json& j) {
  HardwarePeak h;
  h.gflops = j.at("gflops").get<double>();
  h.ghz = j.at("ghz").get<double>();
  h.flops_per_cycle = j.at("flops_per_cycle").get<double>();
  h.threads = j.at("threads").get<int>();
  h.instruction = j.at("instruction").get<std::string>();
  h.derived = j.at("derived").get<bool>();
  return h;
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// No GEMM runs faster than the FMA units under it, so a timed hardware peak below a GEMM measured
// on the same cores was disturbed (on a shared host, a neighbour on the core's other hardware
// thread halves the FMA rate for a while: CI once read 16 FLOP/cycle where the core has 32). It
// is timed again, a few times a second apart (the GEMM's timing spans seconds, the FMA loop's a
// fifth of one), keeping the best; if it stays below, the run says so. Returns whether the peak
// changed.
bool raise_timed_peak_to(HardwarePeak& hardware, double gemm_gflops, const PeakRequest& r) {
  if (hardware.derived || hardware.gflops <= 0 || hardware.gflops >= gemm_gflops) return false;
  const double first = hardware.gflops;
  for (int attempt = 0; attempt < 4 && hardware.gflops < gemm_gflops; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    const HardwarePeak again = measure_hardware_peak(r.precision, r.threads);
    if (again.gflops > hardware.gflops) hardware = again;
  }
  if (hardware.gflops < gemm_gflops)
    std::fprintf(stderr, "cleave: warning: the hardware FMA peak timed %.0f GF/s (first %.0f), "
                         "below the GEMM peak of %.0f GF/s on the same %d threads: the cores "
                         "were shared while it was timed; `cleave peak --refresh` times both "
                         "again\n", hardware.gflops, first, gemm_gflops, r.threads);
  return hardware.gflops != first;
}

}  // namespace

const char* source_name(PeakSource s) {
  switch (s) {
    case PeakSource::measured: return "measured";
    case PeakSource::cached: return "cached";
    case PeakSource::configured: return "configured";
    case PeakSource::hardware: return "hardware";
  }
  return "?";
}

std::string default_peak_cache() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/cleave/peaks.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return std::string(h) + "/.cache/cleave/peaks.json";
  return "";
}

ComputePeak resolve_peak(const PeakRequest& r) {
  ComputePeak peak;
  peak.key = cache_key(r.precision, r.threads);
  nlohmann::json cache = read_cache(r.cache_path);
  nlohmann::json entry = r.refresh || !cache.contains(peak.key) ? nlohmann::json::object()
                                                                : cache[peak.key];
  bool changed = false;
  try {
    if (entry.contains("hardware")) peak.hardware = hardware_from(entry["hardware"]);
  } catch (const nlohmann::json::exception&) {
    entry = nlohmann::json::object();  // an entry of another version: measure again
  }
  if (!entry.contains("hardware")) {
    peak.hardware = measure_hardware_peak(r.precision, r.threads);
    entry["hardware"] = to_json(peak.hardware);
    changed = true;
  }
  if (r.configured_gflops > 0) {
    peak.gflops = r.configured_gflops;
    peak.source = PeakSource::configured;
  } else if (r.hardware) {
    if (peak.hardware.gflops <= 0)
      throw Error("train.mfu_peak = \"hardware\": the hardware peak of this CPU is unknown; use "
                  "\"gemm\" or set train.peak_gflops");
    peak.gflops = peak.hardware.gflops;
    peak.source = PeakSource::hardware;
  } else if (entry.contains("gemm_gflops") && entry["gemm_gflops"].is_number()) {
    peak.gflops = entry["gemm_gflops"].get<double>();
    peak.source = PeakSource::cached;
  } else {
    const GemmPeak g = measure_gemm_peak(r.precision, kGemmPeakSeconds);
    peak.gflops = g.gflops;
    peak.source = PeakSource::measured;
    entry["gemm_gflops"] = g.gflops;
    entry["gemm_rounds"] = g.rounds;
    entry["gemm_seconds"] = g.seconds;
    changed = true;
    if (raise_timed_peak_to(peak.hardware, g.gflops, r))
      entry["hardware"] = to_json(peak.hardware);
  }
  if (changed && !r.cache_path.empty()) {
    entry["measured_at"] = utc_now();
    cache = read_cache(r.cache_path);  // what others wrote meanwhile stays
    cache[peak.key] = entry;
    write_cache(r.cache_path, cache);
  }
  return peak;
}

}  // namespace cleave
