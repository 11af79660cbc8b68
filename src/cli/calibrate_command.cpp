// cleave calibrate: measures this machine kind and writes its cluster file (plan/cluster.h,
// docs/planner.md#cluster-files-and-calibration): the GEMM table of fp32 and bf16 products, the
// GEMM peaks, the memory bandwidth, and under mpirun each collective's alpha-beta on the links
// the ranks share.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <oneapi/dnnl/dnnl.hpp>

#include "cleave/base/file.h"
#include "cleave/base/host_memory.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/group.h"
#include "cleave/kernels/hardware_peak.h"
#include "cleave/kernels/memory_bandwidth.h"
#include "cleave/plan/calibration.h"
#include "cli/args.h"
#include "cli/calibrate_measure.h"

namespace cleave::cli {

namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// "load average 1.23 on 2 CPUs" at the start: neighbours slow every figure down.
std::string load_text() {
  std::ifstream in("/proc/loadavg");
  std::string load;
  if (!(in >> load)) load = "unknown";
  return "load average " + load + " on " + std::to_string(std::thread::hardware_concurrency()) +
         " CPUs";
}

}  // namespace

int calibrate(int argc, char** argv) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Args a;
  std::string out;
  bool quick = false;
  agree_on_errors([&] {
    a = Args::parse("calibrate", argc, argv, {"--out", "--threads"}, {"--quick"});
    if (!a.positional.empty())
      throw Error("cleave calibrate: takes no positional arguments, got '" + a.positional[0] + "'");
    out = a.get("--out", "cluster.toml");
    const std::filesystem::path dir = std::filesystem::absolute(out).parent_path();
    if (!std::filesystem::is_directory(dir))
      throw Error("cleave calibrate: --out " + out + ": no folder " + dir.string());
    if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 0, 1, 4096)));
    quick = a.has("--quick");
  });
  init_comm(CommOptions{});
  const CalibrationPlan plan = calibration_plan(quick);
  const int threads = omp_get_max_threads();

  // Hosts: the ranks that share memory (MPI_Comm_split_type SHARED) are on one host.
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int host_rank = 0, host_size = 1;
  MPI_Comm_rank(host, &host_rank);
  MPI_Comm_size(host, &host_size);
  int counts[3] = {host_rank == 0 ? 1 : 0, host_size, -host_size};  // hosts, min, -max per host
  MPI_Allreduce(MPI_IN_PLACE, counts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, counts + 1, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const int hosts = counts[0], min_per_host = counts[1], max_per_host = -counts[2];

  const std::string cpu = cpu_info("model name").empty() ? "unknown CPU" : cpu_info("model name");
  const dnnl_version_t* v = dnnl_version();
  const std::string onednn = "oneDNN " + std::to_string(v->major) + "." +
                             std::to_string(v->minor) + "." + std::to_string(v->patch) +
                             " (ISA " + onednn_isa() + ")";
  const std::string when = utc_now(), load = load_text();
  const std::string ranks_text = std::to_string(world) + " rank" + (world == 1 ? "" : "s") +
                                 " on " + std::to_string(hosts) + " host" +
                                 (hosts == 1 ? "" : "s") + " x " + std::to_string(threads) +
                                 " OpenMP thread" + (threads == 1 ? "" : "s");
  if (rank == 0) {
    std::printf("cleave calibrate%s: %s; %s, %s; %s; writing %s\n"
                "every rank measures at once (a step's ranks compute at once); each compute "
                "figure is the mean over ranks\n",
                quick ? " --quick" : "", ranks_text.c_str(), cpu.c_str(), onednn.c_str(),
                load.c_str(), out.c_str());
    std::fflush(stdout);
  }

  Cluster c;
  c.name = std::filesystem::path(out).stem().string();
  c.source = "measured by `cleave calibrate --out " + out + (quick ? " --quick" : "") +
             "` on " + when + ": " + ranks_text + ", " + cpu + ", " + onednn;
  c.devices_per_host = host_size;
  std::map<std::string, std::string> comments;
  comments[""] =
      "A cluster file of cleave's planner (docs/planner.md#cluster-files-and-calibration).\n"
      "Measured by `cleave calibrate` on " + when + " (" + load + " at the start).\nCPU: " +
      cpu + "; " + onednn + ".\n" +
      ranks_text + ". Every rank measured at once, as a step's ranks compute at once;\n"
      "each compute figure is the mean over ranks.";

  for (Precision p : {Precision::fp32, Precision::bf16})
    c.gemm[p] = measure_gemm(p, plan, rank, out + ": gemm." + precision_name(p));
  comments["gemm"] =
      "GF/s of C[m, n] = A[m, k] B[k, n]: the mean time of the passes of linear layers that\n"
      "compute it (forward, backward_input, backward_weight; kernels/gemm_bench.h, as\n"
      "`cleave bench-gemm` times them), each pass's median call on the wall clock, every rank\n"
      "timing at once; the median of " + std::to_string(plan.gemm_rounds) + " round" +
      (plan.gemm_rounds == 1 ? "" : "s") + " over the grid; " + std::to_string(threads) +
      " thread" + (threads == 1 ? "" : "s") + " per rank.";

  std::string peak_note;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const char* dtype = precision_name(p);
    if (quick) {
      double best = 0;
      for (const GemmPoint& g : c.gemm[p].points()) best = std::max(best, g.gflops);
      c.peak_gflops[p] = best;
      peak_note += std::string(dtype) + ": the GEMM table's best rate (--quick measures no peak)\n";
    } else {
      const ComputePeak peak = trainer_peak(p, host);
      c.peak_gflops[p] = measured(peak.gflops);
      peak_note += std::string(dtype) + ": the GEMM peak of " +
                   precision_name(product_precision(p)) + " products, " +
                   source_name(peak.source) + " (train/peak.h, as `cleave peak`); hardware FMA "
                   "peak " + (peak.hardware.gflops > 0 ? fixed(peak.hardware.gflops, 1) + " GF/s"
                                                       : std::string("unknown")) + "\n";
    }
    if (rank == 0) {
      std::printf("peak %s: %.1f GF/s (%s)\n", dtype, c.peak_gflops[p],
                  quick ? "the table's best rate: --quick measures no peak" : "GEMM peak");
      std::fflush(stdout);
    }
  }
  comments["peak_gflops"] =
      "Per rank, the peaks the trainer quotes MFU against:\n" + peak_note +
      "fp16 and fp8 have no products of their own on this CPU: fp16 runs as\n" +
      precision_name(product_precision(Precision::fp16)) + " products, fp8 as " +
      precision_name(product_precision(Precision::fp8)) + " products (kernels/linear.h).";

  const int64_t llc = last_level_cache_bytes();
  const int64_t array_bytes = std::clamp(4 * llc, plan.triad_min_bytes, plan.triad_max_bytes);
  const TriadResult triad = measure_triad(array_bytes, plan.triad_passes);
  c.memory_gbps = measured(world_mean(triad.gbps));
  const std::string triad_what = "STREAM triad over 3 arrays of " +
                                 size_text(triad.array_bytes) + " (last-level cache " +
                                 size_text(llc) + ")";
  const std::string triad_how = "best of " + std::to_string(triad.passes) + " passes, " +
                                std::to_string(triad.threads) + " thread" +
                                (triad.threads == 1 ? "" : "s") + " per rank, every rank at once";
  if (rank == 0) {
    std::printf("memory bandwidth: %.2f GB/s per rank (%s, %s)\n", c.memory_gbps,
                triad_what.c_str(), triad_how.c_str());
    std::fflush(stdout);
  }
  comments["cluster.memory_gbps"] =
      "GB/s per rank (kernels/memory_bandwidth.h): " + triad_what + ",\n" + triad_how;
  comments["cluster.attention_dtype"] =
      "cleave's attention kernels compute in fp32 (the [attention] rates below stand in for it)";
  measure_kernel_rates(plan, rank, c, comments);
  const double host_gib = double(host_memory_bytes()) / (1 << 30);
  c.memory_gib = measured(host_gib / host_size);
  comments["cluster.memory_gib"] = "the host's memory (MemTotal " + fixed(host_gib, 2) +
                                   " GiB) over the " + std::to_string(host_size) +
                                   " rank" + (host_size == 1 ? "" : "s") + " on it";

  const std::string sizes = "f32, " + size_text(plan.comm.min_bytes) + " to " +
                            size_text(plan.comm.max_bytes) + " by x" +
                            std::to_string(plan.comm.factor);
  const std::string model =
      "time = alpha_us x steps + bytes sent / beta_gbps, fitted to the measured times\n"
      "(docs/planner.md). Measured with bench-comm (comm/comm_bench.h) over the collectives the\n"
      "trainer calls (CommAlgo::fastest), " + sizes + ";\na time is the median of the slowest rank.";
  // intra_host: the ranks of each host among themselves, every host at once.
  const std::string intra = "collectives.intra_host", inter = "collectives.inter_host";
  if (world == 1) {
    comments[intra] = "[" + intra + "] not measured: one rank (run calibrate under mpirun with 2 ranks\nor more)";
    comments[inter] = "[" + inter + "] not measured: one rank";
    if (rank == 0) {
      std::printf("collectives: not measured: one rank (run under mpirun)\n");
      std::printf("compute imbalance: none: one rank waits for no other\n");
    }
  } else {
    Group everyone(MPI_COMM_WORLD, "world");
    c.compute_imbalance =
        measured(measure_compute_imbalance(everyone, plan, comments["cluster.compute_imbalance"]));
    if (rank == 0) {
      std::printf("compute imbalance: %.3f (the slowest of %d ranks that wait for each other, "
                  "against their mean)\n", c.compute_imbalance, world);
      std::fflush(stdout);
    }
    if (min_per_host >= 2 && min_per_host == max_per_host) {
      Group group(host, "intra_host");
      c.links[size_t(LinkClass::intra_host)] =
          measure_link(group, LinkClass::intra_host, plan, rank == 0, comments,
                       c.compute_slowdown[size_t(LinkClass::intra_host)]);
      comments[intra] = std::to_string(host_size) + " ranks on one host. " + model;
    } else {
      comments[intra] = "[" + intra + "] not measured: " +
                        (min_per_host == max_per_host
                             ? std::string("every rank has a host of its own")
                             : "hosts hold " + std::to_string(min_per_host) + " to " +
                                   std::to_string(max_per_host) + " ranks");
      if (rank == 0) std::printf("%s\n", comments[intra].c_str());
    }
    // inter_host: one rank per host, across hosts.
    if (hosts >= 2) {
      MPI_Comm across;
      MPI_Comm_split(MPI_COMM_WORLD, host_rank == 0 ? 0 : MPI_UNDEFINED, rank, &across);
      if (across != MPI_COMM_NULL) {
        Group group(across, "inter_host");
        c.links[size_t(LinkClass::inter_host)] =
            measure_link(group, LinkClass::inter_host, plan, rank == 0, comments,
                         c.compute_slowdown[size_t(LinkClass::inter_host)]);
        MPI_Comm_free(&across);
      }
      comments[inter] = std::to_string(hosts) + " hosts, one rank on each. " + model;
    } else {
      comments[inter] = "[" + inter + "] not measured: all " + std::to_string(world) +
                        " ranks share one host (MPI_Comm_split_type\nSHARED); run calibrate "
                        "with ranks on two hosts or more to measure it";
      if (rank == 0) std::printf("inter_host: not measured: all ranks share one host\n");
    }
  }
  MPI_Comm_free(&host);
  MPI_Barrier(MPI_COMM_WORLD);

  if (rank == 0) {
    const std::string text = cluster_toml(c, comments);
    parse_cluster(text, out);  // what is written reads back
    write_file_atomic(out, text, "cluster file");
    std::printf("wrote %s\n", out.c_str());
  }
  return 0;
}

}  // namespace cleave::cli
