// The predicted time of one training step: every pipeline rank's step program simulated, each
// instruction costed by the cluster's models (plan/cluster.h) from the work plan/step_work.h
// gives it (docs/planner.md, Step time). Within a rank, compute and the collectives an
// instruction waits for run one after another; gradient reductions and ZeRO-3's prefetches run
// on a communication stream beside compute, in the order posted, and are waited for where the
// program waits for them (finish_grads, gather); a pipeline send arrives at its peer after its
// transfer time, and a receive waits for it, so the bubble comes out of the schedule itself. A
// collective that runs beside compute stalls the rank where it is posted by its time times the
// link's compute_slowdown. On more than one rank every instruction's compute takes the
// cluster's compute_imbalance times its time: the ranks wait for the slowest at each collective;
// an instruction's waited products (the busiest ep rank's extra expert rows) add to it.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cleave/parallel/layout.h"
#include "cleave/plan/cluster.h"
#include "cleave/plan/step_work.h"

namespace cleave {

// What one instruction costs, in seconds: its compute, the collectives it waits for itself, and
// those it posts to run beside compute (each with the axis it is reported on).
struct InstructionCost {
  double compute = 0;
  std::vector<std::pair<std::string, double>> blocking, overlapped;
};

// Where each rank's time went: compute by kind, the waits on each axis's collectives beyond
// compute (blocking ones in full, overlapped ones where the program waited for them), and the
// waits for other stages' transfers.
struct RankTime {
  double gemm = 0, attention = 0, elementwise = 0;
  // The compute's wait for the slowest of the ranks that synchronize: the compute above times
  // the cluster's compute_imbalance less 1 (0 on one rank), and under ep with a measured routing
  // the busiest ep rank's expert products beyond the rank's own (InstructionWork::waited).
  double imbalance = 0;
  std::map<std::string, double> comm;  // exposed seconds per axis
  double pipeline_wait = 0;
  double end = 0;  // when the rank's program ends
  // Each schedule action's compute (its units and the collectives they wait for), in seconds
  // from the step's start, named as the trainer's trace names it (action_name): the timeline.
  struct Span {
    std::string action;
    double start = 0, end = 0;
  };
  std::vector<Span> spans;
};

// Simulates one run of every pp rank's program (pp rank r: programs[r]), cost(r, i) being the
// cost of programs[r]'s instruction i; a send's overlapped cost is its message's transfer, which
// the matching receive waits for. Compute goes to RankTime::gemm (the caller splits it). Throws
// Error when the programs deadlock (a receive with no matching send).
std::vector<RankTime> simulate_programs(
    const std::vector<Program>& programs,
    const std::function<InstructionCost(int rank, size_t i)>& cost);

// Every instruction of pp rank `work.pp_rank`'s step costed on `cluster` (its links as the rank's
// groups sit on the cluster's hosts), and the compute by kind.
struct CostedWork {
  std::vector<InstructionCost> costs;  // per instruction of work.program
  double gemm = 0, attention = 0, elementwise = 0, imbalance = 0;
};
CostedWork cost_work(const StepWork& work, const Layout& layout, const Cluster& cluster);

struct StepPrediction {
  std::vector<RankTime> ranks;  // per pp rank
  double step_seconds = 0;      // the slowest rank's end
  double tokens_per_second = 0;
  double model_flops = 0;  // per step, over every rank
  double peak_gflops = 0;  // per device, of the dtype the products run as; 0: unknown
  double mfu = 0;          // model_flops / step_seconds / (devices x peak); 0 when unknown
};

// The step of `layout` (its pp ranks' work, from step_work) on `cluster` (its devices_per_host
// consecutive world ranks on each host): the step's micro_batch_size x seq_len x
// grad_accum_steps tokens, their FLOPs as the trainer's MFU counts them (model_flops_per_token).
StepPrediction predict_step(const std::vector<StepWork>& work, const Layout& layout,
                            const Cluster& cluster, const ModelConfig& model,
                            const StepOptions& step);

}  // namespace cleave
