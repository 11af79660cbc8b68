// cleave calibrate's measurements: see calibrate_measure.h.
#include "cli/calibrate_measure.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "cleave/base/buffer.h"
#include "cleave/base/file.h"
#include "cleave/base/host_memory.h"
#include "cleave/base/statistics.h"
#include "cleave/comm/comm_bench.h"
#include "cleave/comm/group.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/kernels/kernel_rates.h"
#include "cleave/plan/calibration.h"
#include "cleave/plan/step_work.h"
#include "cleave/train/peak.h"

namespace cleave::cli {

namespace {

// What a collective running beside compute costs the compute (Cluster::compute_slowdown):
// bench-comm's overlap measurement (an all_reduce of the largest size posted, then a computation
// about twice as long on the calling thread, then the wait), as the time the pair took beyond the
// computation alone per second of the all_reduce alone; the mean over the group's ranks.
double measure_link_slowdown(Group& group, const CalibrationPlan& plan, std::string& comment) {
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

}  // namespace

CalibrationPlan calibration_plan(bool quick) {
  CalibrationPlan p;
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

// A measured figure to 4 significant digits: the file then shows what the measurement can tell.
double measured(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
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
GemmTable measure_gemm(Precision p, const CalibrationPlan& plan, int rank, const std::string& where) {
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
void measure_kernel_rates(const CalibrationPlan& plan, int rank, Cluster& c,
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

// How much longer the same compute takes when the ranks wait for each other after each piece,
// as a step's ranks do at its collectives (Cluster::compute_imbalance): every rank runs one
// product (a forward of block_tokens x d_model by d_model, about as long as the compute between
// tp's collectives) and then a sum over the group, which every rank waits for, for
// imbalance_seconds; the wall time per piece over the mean of the ranks' own times for it. The
// pieces are many and the time seconds long because a shared machine's cores slow down one at
// a time, for seconds.
double measure_compute_imbalance(Group& group, const CalibrationPlan& plan, std::string& comment) {
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
LinkCosts measure_link(Group& group, LinkClass link, const CalibrationPlan& plan, bool report,
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

}  // namespace cleave::cli
