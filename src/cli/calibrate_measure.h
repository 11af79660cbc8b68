// cleave calibrate's measurements (cli/calibrate_command.cpp writes the cluster file from them):
// what is measured and for how long (CalibrationPlan), and each figure's measurement, every rank
// at once, with what it was measured on for the file's comments.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cleave/comm/comm_bench.h"
#include "cleave/comm/group.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/plan/cluster.h"
#include "cleave/train/peak.h"

namespace cleave::cli {

struct CalibrationPlan {
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

// The full plan, or --quick's (seconds on a small grid: tests and smoke runs).
CalibrationPlan calibration_plan(bool quick);

// x's mean over the world's ranks.
double world_mean(double x);
// A measured figure to 4 significant digits: the file then shows what the measurement can tell.
double measured(double v);
std::string size_text(int64_t bytes);  // "64 MiB", "4 KiB"
std::string fixed(double v, int digits);

// The GEMM table of products in precision p (`where` names it in errors).
GemmTable measure_gemm(Precision p, const CalibrationPlan& plan, int rank, const std::string& where);
// The rates of the kernels other than the products into c, their comments into `comments`.
void measure_kernel_rates(const CalibrationPlan& plan, int rank, Cluster& c,
                          std::map<std::string, std::string>& comments);
// The peak the trainer quotes a dtype's MFU against, resolved once per host.
ComputePeak trainer_peak(Precision p, MPI_Comm host);
// Cluster::compute_imbalance over `group`, its comment into `comment`.
double measure_compute_imbalance(Group& group, const CalibrationPlan& plan, std::string& comment);
// Each collective's alpha-beta fit on the link `group` spans, and (into `slowdown`) what its
// collectives cost compute beside them; prints as it goes where `report`.
LinkCosts measure_link(Group& group, LinkClass link, const CalibrationPlan& plan, bool report,
                       std::map<std::string, std::string>& comments, double& slowdown);

}  // namespace cleave::cli
