// `cleave plan --search`: every layout of a model on N devices that cleave can run, those whose
// ranks fit in the cluster's device memory ranked by predicted tokens/s (docs/planner.md,
// Search). A layout is a factorisation of N into pp x dp_replicate x dp_shard x cp x tp, with ep
// (MoE models), the ZeRO stage, sequence parallelism (tp > 1), activation checkpointing and the
// number of micro-batches the step's fixed global batch is cut into; it is valid when
// `cleave train` would accept it (plan_layout), and costed by the same memory plan and step
// simulation as `cleave plan`; only those within reach of the top are costed in full.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"
#include "cleave/plan/cluster.h"
#include "cleave/plan/step_time.h"

namespace cleave {

struct Candidate {
  ParallelConfig parallel;
  StepOptions step;
  std::string label() const;  // "pp 2 x dp_shard 2 x tp 2, ZeRO-1, SP, AC full, 8 micro-batches"
};

// Every layout of the search space that plan_layout accepts, from the config's own (its model,
// global batch of micro_batch_size x grad_accum_steps sequences, schedule and recipe kept).
std::vector<Candidate> valid_layouts(const ModelConfig& model, const ParallelConfig& base,
                                     const StepOptions& base_step, int world);

struct Ranked {
  Candidate candidate;
  int64_t peak_bytes = 0;  // the largest stage's planned memory per rank
  bool fits = false;       // within the cluster's memory per device
  StepPrediction prediction;  // when it fits
};

// A candidate planned and, when it fits the cluster's memory per device, simulated, as `cleave
// plan` plans and simulates one layout.
Ranked cost_layout(const ModelConfig& model, const Candidate& candidate,
                   const std::string& optimizer_offload, int world, const Cluster& cluster);

struct SearchResult {
  size_t valid = 0;           // the layouts cleave train accepts
  size_t beyond_memory = 0;   // that a lower bound of their memory puts above the device's
  size_t planned = 0;         // planned in full; those that fit were simulated
  size_t fitting = 0;         // of those planned, those that fit
  size_t beyond_time = 0;     // that a lower bound of their step time puts below the `top`-th
  std::vector<Ranked> best;   // the `top` that fit, by predicted tokens/s (the best first)
  // When none fits: the one that needs the least memory.
  std::optional<Ranked> smallest;
};

// The best `top` of valid_layouts on the cluster, exactly as costing every one and ranking them
// would give (ties in the order valid_layouts lists them), costing in full only those that lower
// bounds of their memory and step time (plan/layout_bounds.h) leave in reach of the top.
SearchResult search_layouts(const ModelConfig& model, const ParallelConfig& base,
                            const StepOptions& base_step, const std::string& optimizer_offload,
                            int world, const Cluster& cluster, int top);

// A sentence or two on why `winner` beats `runner_up`: their throughputs and the part of the
// step (products, attention, element-wise work, the pipeline's waits, an axis's collectives) in
// which their slowest stages differ most; or, at equal throughputs, that they tie.
std::string explain_winner(const Ranked& winner, const Ranked& runner_up);

}  // namespace cleave
