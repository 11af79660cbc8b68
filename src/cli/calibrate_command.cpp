// cleave calibrate: measures this machine kind and writes its cluster file (plan/cluster.h,
// docs/planner.md#cluster-files-and-calibration): the GEMM table of fp32 and bf16 products, the
// GEMM peaks, the memory bandwidth, and under mpirun each collective's alpha-beta on the links
// the ranks share.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <oneapi/dnnl/dnnl.hpp>

#include "cleave/base/buffer.h"
#include "cleave/base/file.h"
#include "cleave/base/host_memory.h"
#include "cleave/base/statistics.h"
#include "cleave/comm/comm_bench.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/group.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/kernels/hardware_peak.h"
#include "cleave/kernels/kernel_rates.h"
#include "cleave/kernels/memory_bandwidth.h"
#include "cleave/plan/calibration.h"
#include "cleave/plan/step_work.h"
#include "cleave/train/peak.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

struct Plan {
  std::vector<int> gemm_dims;
  double gemm_seconds_per_shape = 0;  // bench_linear_shapes' budget per shape (3 passes)
  int gemm_rounds = 0;                // over the whole grid, the budget split between them
  int64_t triad_min_bytes = 0, triad_max_bytes = 0;
  int triad_passes = 0;
  // The other kernels (kernels/kernel_rates.h): a block's element-wise kernels on block_tokens
  // rows of d_model, attention over each of attention_keys tokens, the packing of a [4 d_model,
  // d_model] weight; kernel_seconds of timing each.
  int64_t block_tokens = 0;
  int d_model = 0;
  std::vector<int64_t> attention_keys;
  double kernel_seconds = 0;
  double imbalance_seconds = 0;  // measure_compute_imbalance's time
  // Released memory written again: in a buffer of 4 KiB pages and in one of huge pages, in
  // ranges of a unit's size.
  int64_t small_buffer_bytes = 0, small_range_bytes = 0, huge_buffer_bytes = 0,
          huge_range_bytes = 0;
  CommBenchOptions comm;
};

Plan plan_of(bool quick) {
  Plan p;
  p.gemm_dims = quick ? std::vector<int>{32, 128} : std::vector<int>{128, 512, 2048};
  p.gemm_seconds_per_shape = quick ? 0.01 : 0.3;
  p.gemm_rounds = quick ? 1 : 3;
  p.triad_min_bytes = (quick ? 32 : 64) * kMiB;
  p.triad_max_bytes = (quick ? 256 : 512) * kMiB;
  p.triad_passes = quick ? 3 : 10;
  p.block_tokens = quick ? 128 : 1024;
  p.d_model = quick ? 128 : 768;
  p.attention_keys = quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{128, 512, 2048};
  p.kernel_seconds = quick ? 0.02 : 0.3;
  p.imbalance_seconds = quick ? 0.05 : 4;
  p.small_buffer_bytes = (quick ? 4 : 16) * kMiB;
  p.small_range_bytes = (quick ? 256 : 1024) * int64_t(1024);
  p.huge_buffer_bytes = int64_t(kHugePageBufferBytes) * (quick ? 1 : 2);
  p.huge_range_bytes = (quick ? 8 : 12) * kMiB;
  p.comm.min_bytes = 4 << 10;
  p.comm.max_bytes = int64_t(quick ? 1 : 64) << 20;
  p.comm.factor = quick ? 4 : 2;
  p.comm.seconds_per_case = quick ? 0.02 : 0.2;
  p.comm.algos = {CommAlgo::fastest};
  p.comm.types = {CommType::f32};
  return p;
}

double world_mean(double x) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x / world;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// A measured figure to 4 significant digits: the file then shows what the measurement can tell.
double measured(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
}

// "load average 1.23 on 2 CPUs" at the start: neighbours slow every figure down.
std::string load_text() {
  std::ifstream in("/proc/loadavg");
  std::string load;
  if (!(in >> load)) load = "unknown";
  return "load average " + load + " on " + std::to_string(std::thread::hardware_concurrency()) +
         " CPUs";
}

std::string size_text(int64_t bytes) {
  return bytes >= (int64_t(1) << 20) ? std::to_string(bytes >> 20) + " MiB"
                                     : std::to_string(bytes >> 10) + " KiB";
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Every rank times the same shapes at once, as a step's ranks compute at once; a pass's time is
// the mean over ranks of its median over rounds. Each round times the whole grid: a slow spell of
// a shared machine then lengthens one round of many points rather than every round of a few (with
// one pass over the grid, 4 of 11 calibrations of a Xeon VM had a point 20-46% below all of its
// neighbours), and the table stays of one machine.
GemmTable measure_gemm(Precision p, const Plan& plan, int rank, const std::string& where) {
  const char* dtype = precision_name(p);
  const auto shapes = calibration_shapes(plan.gemm_dims);
  std::vector<std::vector<GemmBenchResult>> rounds;
  for (int r = 0; r < plan.gemm_rounds; ++r)
    rounds.push_back(
        bench_linear_shapes(shapes, p, plan.gemm_seconds_per_shape / plan.gemm_rounds));
  std::vector<GemmSample> samples;
  std::string line;
  const std::vector<GemmBenchResult>& first = rounds[0];
  for (size_t i = 0; i < first.size(); ++i) {
    std::vector<double> seconds;
    for (const auto& round : rounds) seconds.push_back(round[i].seconds);
    GemmSample s = gemm_sample(first[i]);
    s.seconds = world_mean(median(seconds));
    const double gflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / s.seconds * 1e-9;
    line += "  " + s.pass + " " + fixed(gflops, 1) + " [m=" + std::to_string(s.m) +
            " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) + "]";
    samples.push_back(s);
    const GemmBenchResult& r = first[i];
    const bool shape_done = i + 1 == first.size() || first[i + 1].N != r.N ||
                            first[i + 1].in != r.in || first[i + 1].out != r.out;
    if (!shape_done) continue;
    if (rank == 0) {
      std::printf("gemm %s tokens %lld, in %d, out %d, GF/s:%s\n", dtype, (long long)r.N, r.in,
                  r.out, line.c_str());
      std::fflush(stdout);
    }
    line.clear();
  }
  GemmTable table = gemm_table(samples, where);
  std::vector<GemmPoint> points = table.points();
  for (GemmPoint& g : points) g.gflops = measured(g.gflops);
  table = GemmTable(std::move(points), where);
  if (rank == 0) {
    double lo = 1e300, hi = 0;
    for (const GemmPoint& g : table.points()) lo = std::min(lo, g.gflops), hi = std::max(hi, g.gflops);
    std::printf("gemm %s table: %zu products, %.1f to %.1f GF/s\n", dtype, table.points().size(),
                lo, hi);
  }
  return table;
}

// The rates of the kernels other than the products, every rank at once (each figure the mean
// over ranks), with what each was measured on for the file's comments.
void measure_kernel_rates(const Plan& plan, int rank, Cluster& c,
                          std::map<std::string, std::string>& comments) {
  const int64_t N = plan.block_tokens;
  const int d = plan.d_model;
  double bytes = 0, seconds = 0;
  std::string blocks;
  for (const BlockKernels& b : {BlockKernels{N, d, 4 * d, false}, BlockKernels{N, d, 8 * d / 3, true}}) {
    const PassSeconds t = time_block_elementwise(b, plan.kernel_seconds);
    bytes += 3 * block_elementwise_floats(b.swiglu ? Family::llama : Family::gpt2, d, b.hidden) *
             double(N) * 4;
    seconds += t.forward + t.backward;
    blocks += std::string(blocks.empty() ? "" : " and ") + (b.swiglu ? "Llama's" : "GPT-2's") +
              " (hidden " + std::to_string(b.hidden) + ")";
  }
  c.elementwise_gbps = measured(world_mean(bytes / seconds * 1e-9));
  const std::string on = std::to_string(N) + " tokens of d_model " + std::to_string(d);
  comments["cluster.elementwise_gbps"] =
      "GB/s per rank of a block's element-wise kernels, forward and backward, on the bytes the\n"
      "planner counts for them (plan/step_work.h): " + blocks + " blocks,\n" + on +
      " (kernels/kernel_rates.h), each pass's median, every rank at once";
  const PackTiming pack = time_weight_packing(N, d, 4 * d, Precision::fp32, plan.kernel_seconds);
  // Where the products read W itself there is nothing to pack (the planner counts no bytes). Every
  // rank takes part in the mean, whatever its own products do.
  const double pack_gbps = world_mean(pack.copy_bytes > 0 ? pack.copy_bytes / pack.seconds * 1e-9 : 0);
  const bool packs = pack_gbps > 0;
  if (packs) {
    c.pack_gbps = measured(pack_gbps);
    comments["cluster.pack_gbps"] =
        "GB/s per rank of the copies written when an fp32 weight of " + std::to_string(4 * d) +
        " x " + std::to_string(d) + " is packed band by band\nfor products on " +
        std::to_string(N) + " rows, as the optimizer packs it after an update (the median of one "
        "weight)";
  }
  // FP8's kernels, as what an FP8 linear takes beyond a bf16 one. Where noise leaves no
  // difference, or one so small that the rate would pass 4x the element-wise kernels' (which
  // stream like them), the key is left out and the element-wise rate stands in.
  const Fp8Timing fp8 = time_fp8_kernels(N, d, 4 * d, kernels::Fp8Recipe::delayed, plan.kernel_seconds);
  const double fp8_extra = world_mean(fp8.seconds);
  const double fp8_rate = fp8_extra > 0 ? fp8.bytes / fp8_extra * 1e-9 : 0;
  if (fp8_rate > 0 && fp8_rate <= 4 * c.elementwise_gbps) {
    c.fp8_gbps = measured(fp8_rate);
    comments["cluster.fp8_gbps"] =
        "GB/s per rank of FP8's own kernels (quantisation, amaxes, bf16 images, scaled sums) on\n"
        "the bytes the planner counts for them (kernels::fp8_traffic): what a linear of " +
        std::to_string(d) + " -> " + std::to_string(4 * d) + " on " + std::to_string(N) +
        " rows\ntakes in FP8 (delayed scaling) beyond bf16, forward and backward after a new "
        "weight, each the median, every rank at once";
  }
  constexpr int kHeads = 4, kHeadDim = 64;
  c.attention.clear();
  for (int64_t keys : plan.attention_keys) {
    const PassSeconds t = time_attention(keys, kHeads, kHeadDim, plan.kernel_seconds);
    const double flops = 3 * 2.0 * double(keys) * double(keys) * kHeadDim * kHeads;
    c.attention.push_back({keys, measured(world_mean(flops / (t.forward + t.backward) * 1e-9))});
  }
  comments["attention"] =
      "GF/s per rank of cleave's causal attention over one sequence of `keys` tokens, forward and\n"
      "backward (kernels/attention.h), " + std::to_string(kHeads) + " heads of " +
      std::to_string(kHeadDim) + ", FLOPs as the planner counts them: one full product of\n"
      "queries by keys forward, two backward; each pass's median, every rank at once";
  std::string refaults;
  for (const bool huge : {false, true}) {
    const int64_t buffer = huge ? plan.huge_buffer_bytes : plan.small_buffer_bytes;
    const int64_t range = huge ? plan.huge_range_bytes : plan.small_range_bytes;
    const RefaultTiming t = time_refaults(buffer, range, plan.kernel_seconds);
    // The ranks' seconds are averaged, not their rates: one rank's noise near zero would make an
    // average rate unbounded. Where writing released memory costs nothing measurable, the key
    // is left out (free).
    const double extra = world_mean(t.released_seconds - t.resident_seconds);
    if (extra > 0.01 * t.resident_seconds)
      (huge ? c.refault_huge_gbps : c.refault_gbps) = measured(t.bytes / extra * 1e-9);
    refaults += std::string(huge ? "; " : "") + size_text(range) + " ranges of a " +
                size_text(buffer) + " buffer (" + (huge ? "huge pages" : "4 KiB pages") +
                "): " + fixed(t.released_seconds * 1e3, 2) + " against " +
                fixed(t.resident_seconds * 1e3, 2) + " ms";
  }
  const std::string refault_how =
      "GB/s per rank of released memory written again (ZeRO-2/3: base/released_pages.h), beyond\n"
      "writing it resident: the median pass over ";
  if (c.refault_gbps > 0)
    comments["cluster.refault_gbps"] = refault_how + "ranges of a buffer of 4 KiB pages; rank 0:\n" +
                                       refaults.substr(0, refaults.find(';'));
  if (c.refault_huge_gbps > 0)
    comments["cluster.refault_huge_gbps"] = refault_how + "ranges of a buffer of huge pages, which " +
                                            "the releases split;\nrank 0: " +
                                            refaults.substr(refaults.find(';') + 2);
  if (rank == 0) {
    std::printf("released memory written again: %.3g GB/s per rank (4 KiB pages), %.3g GB/s (huge "
                "pages); %s\n",
                c.refault_gbps, c.refault_huge_gbps, refaults.c_str());
    std::printf("element-wise kernels: %.2f GB/s per rank (%s blocks, %s)\n", c.elementwise_gbps,
                blocks.c_str(), on.c_str());
    if (packs) std::printf("weight packing: %.2f GB/s per rank of copies written\n", c.pack_gbps);
    else std::printf("weight packing: none (fp32 products read the weights as they are)\n");
    if (c.fp8_gbps > 0)
      std::printf("FP8 kernels: %.2f GB/s per rank (%.3f ms beyond bf16 for %.3g MB)\n", c.fp8_gbps,
                  fp8_extra * 1e3, fp8.bytes * 1e-6);
    else
      std::printf("FP8 kernels: no time measured beyond bf16's (or a rate past 4x the element-wise "
                  "kernels'); the element-wise rate stands in\n");
    for (const AttentionRate& r : c.attention)
      std::printf("attention over %lld keys: %.1f GF/s per rank\n", (long long)r.keys, r.gflops);
    std::fflush(stdout);
  }
}

// The peak the trainer quotes a dtype's MFU against (train/peak.h): that of the products the
// dtype runs as, resolved by one rank per host (from the cache, or measured alone while the
// host's other ranks wait), as the trainer resolves it.
ComputePeak trainer_peak(Precision p, MPI_Comm host) {
  int host_rank = 0;
  MPI_Comm_rank(host, &host_rank);
  ComputePeak peak;
  double figures[3] = {};
  if (host_rank == 0) {
    PeakRequest request;
    request.precision = product_precision(p);
    request.threads = omp_get_max_threads();
    request.cache_path = default_peak_cache();
    peak = resolve_peak(request);
    figures[0] = peak.gflops, figures[1] = double(int(peak.source)),
    figures[2] = peak.hardware.gflops;
  }
  MPI_Bcast(figures, 3, MPI_DOUBLE, 0, host);
  peak.gflops = figures[0];
  peak.source = PeakSource(int(figures[1]));
  peak.hardware.gflops = figures[2];
  return peak;
}

// What a collective running beside compute costs the compute (Cluster::compute_slowdown):
// bench-comm's overlap measurement (an all_reduce of the largest size posted, then a computation
// about twice as long on the calling thread, then the wait), as the time the pair took beyond the
// computation alone per second of the all_reduce alone; the mean over the group's ranks.
double measure_link_slowdown(Group& group, const Plan& plan, std::string& comment) {
  const OverlapResult r = measure_overlap(group, plan.comm.max_bytes, CommAlgo::fastest);
  const double extra = r.compute_with_comm + r.waited - r.compute_alone;
  const double local = std::clamp(extra / r.comm_alone, 0.0, 100.0);
  const double slowdown = sum_of_doubles(group, local) / group.size();
  comment = "seconds of compute lost per second of a collective running beside it: an\n"
            "all_reduce of " + size_text(r.bytes) + " alone " + fixed(r.comm_alone * 1e3, 1) +
            " ms; a computation alone " + fixed(r.compute_alone * 1e3, 1) +
            " ms, beside the all_reduce " + fixed(r.compute_with_comm * 1e3, 1) +
            " ms,\nthen waited " + fixed(r.waited * 1e3, 1) + " ms (rank " +
            std::to_string(group.rank()) + "; the mean over ranks)";
  return slowdown;
}

// How much longer the same compute takes when the ranks wait for each other after each piece,
// as a step's ranks do at its collectives (Cluster::compute_imbalance): every rank runs one
// product (a forward of block_tokens x d_model by d_model, about as long as the compute between
// tp's collectives) and then a sum over the group, which every rank waits for, for
// imbalance_seconds; the wall time per piece over the mean of the ranks' own times for it. The
// pieces are many and the time seconds long because a shared machine's cores slow down one at
// a time, for seconds.
double measure_compute_imbalance(Group& group, const Plan& plan, std::string& comment) {
  const int64_t N = plan.block_tokens;
  const int d = plan.d_model;
  LinearGemm gemm(d, d, Precision::fp32);
  Buffer<float> w(int64_t(d) * d), x(N * d), y(N * d);
  for (int64_t i = 0; i < w.size(); ++i) w[i] = float((i % 7) - 3) * 0.01f;
  for (int64_t i = 0; i < x.size(); ++i) x[i] = float((i % 5) - 2) * 0.1f;
  gemm.set_weight(w.data());
  for (int i = 0; i < 3; ++i) gemm.forward(y.data(), x.data(), N, nullptr);
  // The sum's own time, which the planner costs as a collective, is left out of the wait.
  constexpr int kSums = 200;
  sum_of_doubles(group, 0);
  const double sums_start = MPI_Wtime();
  for (int i = 0; i < kSums; ++i) sum_of_doubles(group, 0);
  const double sum_seconds =
      sum_of_doubles(group, (MPI_Wtime() - sums_start) / kSums) / group.size();
  const double start = MPI_Wtime();
  double own = 0;
  int pieces = 0;
  for (bool more = true; more; ++pieces) {
    const double t0 = MPI_Wtime();
    gemm.forward(y.data(), x.data(), N, nullptr);
    own += MPI_Wtime() - t0;
    // Rank 0's clock decides when to stop; the sum is the wait every rank makes.
    const bool over = group.rank() == 0 && MPI_Wtime() - start >= plan.imbalance_seconds;
    more = sum_of_doubles(group, over ? 1.0 : 0.0) == 0;
  }
  const double wall = (MPI_Wtime() - start) / pieces;
  const double mean_own = sum_of_doubles(group, own / pieces) / group.size();
  const double imbalance = std::clamp((wall - sum_seconds) / mean_own, 1.0, 100.0);
  comment = "the slowest of the ranks that wait for each other against their mean (the planner\n"
            "stretches compute by it on more than one rank): " + std::to_string(pieces) +
            " products of " + std::to_string(N) + " x " + std::to_string(d) + " by " +
            std::to_string(d) + " (fp32 forward),\neach followed by a sum over all " +
            std::to_string(group.size()) + " ranks: " + fixed(wall * 1e3, 3) +
            " ms each on the wall clock,\nless the sum's own " + fixed(sum_seconds * 1e3, 3) +
            " ms, against " + fixed(mean_own * 1e3, 3) +
            " ms of a rank's own time (the mean over ranks)";
  return imbalance;
}

// bench_comm per collective on `group` (printing each as it is measured), then the fit, and what
// the link's collectives cost compute beside them.
LinkCosts measure_link(Group& group, LinkClass link, const Plan& plan, bool report,
                       std::map<std::string, std::string>& comments, double& slowdown) {
  const std::string prefix = std::string("collectives.") + link_class_name(link);
  std::vector<CommBenchRow> rows;
  for (Collective kind : kCollectives) {
    CommBenchOptions o = plan.comm;
    o.ops = {collective_name(kind)};
    std::string points;
    int n = 0;
    for (const CommBenchRow& r : bench_comm(group, o)) {
      if (report)
        std::printf("%s %-14s %8s: %10.1f us, busbw %6.2f GB/s\n", link_class_name(link),
                    r.op.c_str(), size_text(r.bytes).c_str(), r.seconds * 1e6, r.busbw);
      points += std::string(n == 0 ? "" : n % 6 ? ", " : ",\n") +
                std::to_string(r.bytes) + ": " + fixed(r.seconds * 1e6, 1);
      rows.push_back(r);
      ++n;
    }
    comments[prefix + "." + collective_name(kind)] = "measured (bytes: us):\n" + points;
  }
  LinkCosts costs = fit_link(rows, group.size());
  for (Collective kind : kCollectives) {
    CollectiveCost& cost = costs[size_t(kind)];
    for (AlphaBeta& ab : cost) ab.alpha_us = measured(ab.alpha_us), ab.beta_gbps = measured(ab.beta_gbps);
    std::vector<CommPoint> points;
    for (const CommBenchRow& r : rows)
      if (r.op == collective_name(kind)) points.push_back({double(r.bytes), r.seconds});
    const int steps = ring_steps(kind, group.size());
    if (report)
      for (const AlphaBeta& ab : cost)
        std::printf("%s %-14s fit%s: alpha %.2f us per step (%d step%s), beta %.3f GB/s\n",
                    link_class_name(link), collective_name(kind),
                    ab.from_bytes ? (" from " + size_text(ab.from_bytes)).c_str() : "",
                    ab.alpha_us, steps, steps == 1 ? "" : "s", ab.beta_gbps);
    const double error = relative_error(cost, kind, group.size(), points);
    if (report)
      std::printf("%s %-14s fit: %d line%s, %.0f%% error (root mean square, relative)\n",
                  link_class_name(link), collective_name(kind), int(cost.size()),
                  cost.size() == 1 ? "" : "s", 100 * error);
    comments[std::string("collectives.") + link_class_name(link) + "." + collective_name(kind)] +=
        "\nfit: " + fixed(100 * error, 0) + "% error (root mean square, relative)";
  }
  slowdown = measured(measure_link_slowdown(group, plan, comments[prefix + ".compute_slowdown"]));
  if (report) std::printf("%s compute_slowdown: %.2f\n", link_class_name(link), slowdown);
  return costs;
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
  const Plan plan = plan_of(quick);
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
