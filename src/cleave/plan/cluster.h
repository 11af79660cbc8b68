// A machine kind as the planner sees it: what one device holds and computes, and what its links
// cost. Read from a cluster file (TOML, docs/planner.md#cluster-files-and-calibration): written by
// `cleave calibrate` for the machine it runs on, or by hand from published specifications
// (clusters/). The planner turns a step's work into time with three models:
//   gemm_seconds        a product's time from a table of measured GF/s by shape and dtype;
//   collective_seconds  a collective's time from a latency-bandwidth (alpha-beta) model per link
//                       class and collective, with the ring's steps and bytes;
//   memory_seconds      work streamed once per parameter (the optimizer) from its bytes and the
//                       device's streaming bandwidth;
//   elementwise_seconds the activations' element-wise kernels (norms, activations, residual adds),
//   fp8_seconds         FP8's quantisation kernels beside its products,
//   pack_seconds        and the packing of weights into the products' layouts, from their bytes
//                       at rates measured by running cleave's kernels (where a file gives none:
//                       the streaming bandwidth, and packing free);
//   attention_seconds   attention from its FLOPs at the rate its kernel measured by keys per
//                       query (the GEMM table of attention_dtype where a file gives none).
// Figures are kept in the file's units (GF/s, GB/s, microseconds, GiB), so a file written and read
// back is the same file.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cleave/kernels/linear.h"

namespace cleave {

enum class LinkClass { intra_host, inter_host };
inline constexpr std::array<LinkClass, 2> kLinkClasses = {LinkClass::intra_host,
                                                          LinkClass::inter_host};
const char* link_class_name(LinkClass l);

enum class Collective { all_reduce, all_gather, reduce_scatter, all_to_all, send_recv };
inline constexpr std::array<Collective, 5> kCollectives = {
    Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
    Collective::all_to_all, Collective::send_recv};
const char* collective_name(Collective c);  // as bench-comm names it: "all_reduce", ...

// The dtypes a cluster file gives peaks and GEMM tables for, in the file's order.
inline constexpr std::array<Precision, 4> kClusterDtypes = {Precision::fp32, Precision::bf16,
                                                            Precision::fp16, Precision::fp8};

// One measured product C[m, n] = A[m, k] B[k, n]: 2mnk FLOPs at `gflops`.
struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  double gflops = 0;
};

// A dtype's GEMM rates on a full grid of shapes (every m listed with every n and every k), and
// the model gemm_seconds evaluates: the log of a product's time, interpolated trilinearly in
// (log m, log n, log k) between the grid's points. A point's time first becomes the largest time
// of the points it dominates (no larger m, n or k): a larger product is never predicted faster
// than a smaller one, which timing noise on tiny products could otherwise invert; with that, the
// predicted time grows with each of m, n and k. Outside the grid each coordinate is clamped to the
// nearest measured one, and the rate found there is kept (the time then scales with m n k). A rate
// above the dtype's peak is taken as the peak.
class GemmTable {
 public:
  GemmTable() = default;
  // Throws Error("WHERE: ...") unless the points form a full grid with one point per shape.
  GemmTable(std::vector<GemmPoint> points, const std::string& where);

  const std::vector<GemmPoint>& points() const { return points_; }  // as given
  // Seconds of one product; peak_gflops <= 0: no peak known.
  double seconds(int64_t m, int64_t n, int64_t k, double peak_gflops) const;

 private:
  std::vector<GemmPoint> points_;
  std::array<std::vector<double>, 3> log_axis_;  // log of the distinct m, n, k, ascending
  std::vector<double> log_seconds_;              // [i_m][i_n][i_k], after the envelope above
};

// The measured rate of causal attention, forward and backward, over sequences of `keys` tokens:
// FLOPs counted as the planner counts them (one full product of queries by keys forward, two
// backward).
struct AttentionRate {
  int64_t keys = 0;
  double gflops = 0;
};

// One latency-bandwidth line of a collective's cost: alpha per step of the ring, then the bytes
// each rank sends at beta (time = alpha * ring_steps + ring_bytes_sent / beta; beta is nccl-tests'
// busbw), for collectives of from_bytes and more.
struct AlphaBeta {
  double alpha_us = 0;     // microseconds per step
  double beta_gbps = 0;    // GB/s (1e9 bytes/s) per rank
  int64_t from_bytes = 0;  // the first line of a cost: 0
};
// A collective's cost on a link class: its lines by ascending from_bytes, the first from 0. A
// collective takes the longest time of the lines that apply to its size. One line is the plain
// alpha-beta model; a second, from a size on, is a slower regime (a CPU's messages outgrowing its
// last-level cache), and taking the longest keeps the time growing with the size.
using CollectiveCost = std::vector<AlphaBeta>;
using LinkCosts = std::array<CollectiveCost, kCollectives.size()>;  // by Collective

struct Cluster {
  std::string name;
  std::string source;  // where the figures come from (free text)
  int devices_per_host = 1;
  double memory_gib = 0;   // per device
  double memory_gbps = 0;  // per device: streaming bandwidth (GB/s), for the optimizer's work
  // GB/s on the planner's byte counts of the activations' element-wise kernels (0, the key
  // absent: memory_gbps) and of weight packing (0: free; the copies counted are this CPU's
  // oneDNN layouts, which a file of another machine does not describe).
  double elementwise_gbps = 0, pack_gbps = 0;
  // GB/s on the planner's byte counts of FP8's own kernels beside its products (quantisation,
  // amaxes, bf16 images, scaled sums: kernels::fp8_traffic); 0 (the key absent): elementwise_gbps.
  double fp8_gbps = 0;
  // GB/s of memory returned to the system and written again (ZeRO-2/3's released gradients and
  // parameters fault in anew every step), beyond writing it resident: in buffers under
  // kHugePageBufferBytes (4 KiB pages) and in larger ones (huge pages, split by the releases);
  // 0 (the key absent): free, as where an allocator keeps the memory (a GPU's).
  double refault_gbps = 0, refault_huge_gbps = 0;
  // The slowest of the ranks that wait for each other, against their mean: how much longer the
  // same compute takes when every rank must finish it before any goes on (a step's collectives
  // and transfers), where ranks run at different speeds from moment to moment (a shared VM's
  // cores), 1 or more; 0 (the key absent): as 1, the devices compute alike.
  double compute_imbalance = 0;
  // Ascending keys ([attention] rates); empty: attention's products costed by the GEMM table of
  // attention_dtype.
  std::vector<AttentionRate> attention;
  // The dtype whose table attention's products take: the kernels' own, fp32 for cleave's CPU
  // kernels, bf16 for FlashAttention on a GPU's tensor cores.
  Precision attention_dtype = Precision::fp32;
  std::map<Precision, double> peak_gflops;  // per device; a dtype absent is "unknown"
  std::map<Precision, GemmTable> gemm;      // a dtype absent has no table
  std::array<std::optional<LinkCosts>, kLinkClasses.size()> links;  // by LinkClass; absent:
                                                                    // not described
  // Per link class (collectives.CLASS.compute_slowdown): the seconds of compute a rank loses per
  // second of a collective running beside it. Near 0 where a NIC or a GPU's copy engines move the
  // bytes; 1 or more where the rank's own core copies and sums them (shared memory on a CPU), and
  // the two also compete for its caches.
  std::array<double, kLinkClasses.size()> compute_slowdown{0.0, 0.0};
};

// Reads a cluster file; every error names the file, the line where it has one, and the key
// ("clusters/x.toml:12: peak_gflops.bf16 = -1.0 is out of range [...]", an unknown key with
// the closest known one, a missing key).
Cluster read_cluster(const std::string& path);
Cluster parse_cluster(const std::string& text, const std::string& origin);

// The cluster as a cluster file that parse_cluster reads back to the same cluster. `comments`
// adds comment lines (text without '#', '\n'-separated) before parts of the file: "" at the top,
// else before a table or key, by its dotted name ("peak_gflops", "gemm.fp32",
// "collectives.intra_host", ...); a link class absent from the cluster keeps its comment, which
// then says why.
std::string cluster_toml(const Cluster& c, const std::map<std::string, std::string>& comments = {});

// Seconds of the product C[m, n] = A[m, k] B[k, n] in dtype p (GemmTable::seconds against the
// dtype's peak). Throws Error naming the cluster when it has no table for p.
double gemm_seconds(const Cluster& c, int64_t m, int64_t n, int64_t k, Precision p);

// The ring's steps and the bytes each of `ranks` ranks sends for a collective of `bytes`, the
// size as bench-comm and nccl-tests give it: all_reduce's buffer, all_gather's gathered output,
// reduce_scatter's input, all_to_all's send buffer, send_recv's message. These are the bytes the
// trainer counts (parallel/comm_meter.h): 2(p-1)/p x bytes for all_reduce, (p-1)/p x bytes for
// all_gather, reduce_scatter and all_to_all, the message for send_recv. Steps: 2(p-1) for
// all_reduce, p-1 for all_gather, reduce_scatter and all_to_all (pairwise), 1 for send_recv.
int ring_steps(Collective kind, int ranks);
double ring_bytes_sent(Collective kind, double bytes, int ranks);

// Seconds of one collective of `bytes` (as above) over `ranks` ranks on `link`: the longest of
// alpha * steps + sent / beta over the collective's lines that apply; 0 for one rank or no bytes.
// Throws Error naming the cluster when it does not describe the link class.
double collective_seconds(const Cluster& c, Collective kind, LinkClass link, double bytes,
                          int ranks);

// Seconds to stream `bytes` through one device's memory.
double memory_seconds(const Cluster& c, double bytes);
// Seconds of the activations' element-wise kernels, and of weight packing, on `bytes` as the
// planner counts them (plan/step_work.h).
double elementwise_seconds(const Cluster& c, double bytes);
double fp8_seconds(const Cluster& c, double bytes);
double pack_seconds(const Cluster& c, double bytes);
// Seconds of faulting in `bytes` of released memory again, in a buffer of huge pages or not.
double refault_seconds(const Cluster& c, double bytes, bool huge_pages);
// The factor `world` ranks' compute stretches by waiting for the slowest of them:
// compute_imbalance, or 1 on one rank (it waits for none) and where the key is absent.
double compute_imbalance_on(const Cluster& c, int world);
// Seconds of attention's products of m queries by n keys over head_dim k (2mnk FLOPs): at the
// attention rate of n keys, interpolated in (log keys, log rate) between measured points and held
// beyond them; without rates, gemm_seconds of attention_dtype.
double attention_seconds(const Cluster& c, int64_t m, int64_t n, int64_t k);

// Fits one alpha-beta line to measured times of a collective over `ranks` ranks by least squares
// on relative error (each point weighted by 1 / its time squared, so that the latency of small
// messages counts as much as the bandwidth of large ones), with alpha >= 0. Needs two sizes or
// more; throws Error when the times do not grow with size (no bandwidth to fit).
struct CommPoint {
  double bytes = 0;  // as collective_seconds takes them
  double seconds = 0;
};
AlphaBeta fit_alpha_beta(Collective kind, int ranks, const std::vector<CommPoint>& points);

// The cost fit_alpha_beta's line gives, or two lines where one does not describe the times: the
// sizes are split in two at every place that leaves two sizes or more on each side, a line is fitted
// to each side, and the best split is taken if the larger sizes' line has the lower bandwidth and
// the relative error (root mean square) of the two-line cost is at least a quarter below the one
// line's. The second line starts halfway (in log size) between the sizes on either side of the
// split.
CollectiveCost fit_collective(Collective kind, int ranks, const std::vector<CommPoint>& points);

// The root mean square relative error of a cost against measured times.
double relative_error(const CollectiveCost& cost, Collective kind, int ranks,
                      const std::vector<CommPoint>& points);

}  // namespace cleave
