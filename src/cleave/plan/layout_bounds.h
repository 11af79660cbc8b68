// Lower bounds on a layout's step time and memory, from probes that many layouts share, so that
// `cleave plan --search` plans and simulates in full only the layouts that can reach its top
// (docs/planner.md, Search). Within a rank the simulation runs compute and the collectives an
// instruction waits for one after another, so a pp rank's step takes at least, for every
// micro-batch, the forward, backward and recompute of its stages' units with their blocking
// collectives, started no earlier than the first micro-batch's forward through the stages before
// its first. Those per-unit costs depend on the shape of a micro-batch on a rank (tp, cp, SP, AC,
// its sequences, ep), not on the data-parallel split, the pipeline or the number of
// micro-batches: one one-rank-per-stage, one-micro-batch program per shape gives them all, under
// ZeRO-0 (ZeRO-2/3's packing after gathers and refaults only add to them).
// A rank's memory is at least its model state under its ZeRO stage (its shard counted over the
// whole data-parallel group), its linears' weight copies (below ZeRO-3), plus, for each of its
// chunks, a slot's buffers for every micro-batch the schedule keeps in flight there, and the
// activations its blocks keep after their forward for as many micro-batches in its fullest chunk.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cleave/model/model_config.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/layout.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"
#include "cleave/plan/cluster.h"

namespace cleave {

// Safe to use from several threads at once (the search bounds layouts on all of them).
class LayoutBounds {
 public:
  LayoutBounds(const ModelConfig& model, std::string optimizer_offload, int world,
               const Cluster& cluster);

  // Seconds that no step of the layout can take less than, whose stages `pipeline` places
  // (plan_pipeline's for its pp and micro-batch count).
  double step_seconds(const ParallelConfig& parallel, const StepOptions& step,
                      const PipelinePlan& pipeline);
  // Bytes that the layout's fullest pp rank holds at least.
  double memory_bytes(const ParallelConfig& parallel, const StepOptions& step,
                      const PipelinePlan& pipeline);

 private:
  // Per layer in forward order (the embedding first, the head last), per micro-batch.
  struct UnitCosts {
    std::vector<double> forward, all;  // forward: its forward; all: forward, backward, recompute
    bool valid = false;                // the probe could be planned
  };
  // Each made once (entries never change once in their tables).
  const UnitCosts& unit_costs(const ParallelConfig& parallel, const StepOptions& step);
  UnitCosts probe(const ParallelConfig& parallel, const StepOptions& step, bool with_comms) const;
  // The model on one rank (its tp share, no values, every expert), and per parameter group, per
  // layer as UnitCosts, its parameters (a rank holds its group_shares of them).
  struct Planned {
    std::unique_ptr<Transformer> model;
    std::vector<std::vector<double>> floats;
  };
  const Planned& planned(int tp, bool sequence_parallel, bool selective, Precision dtype);
  // Per layer as UnitCosts, the bytes of the weight copies its linears' products keep (packed
  // layouts, images in the product's type) for micro-batches of `rows` rows on a rank that holds
  // 1 / ep of the experts.
  const std::vector<double>& weight_copies(const Planned& planned, int64_t rows, int ep);

  const ModelConfig& model_;
  std::string optimizer_offload_;
  int world_;
  const Cluster& cluster_;
  std::mutex mutex_;  // guards the probes' tables; a probe runs outside it
  std::map<std::tuple<bool, bool, int, int, bool, std::string, int64_t, int, int>, UnitCosts>
      costs_;
  std::map<std::tuple<int, bool, bool, Precision>, Planned> planned_;
  std::map<std::tuple<const Planned*, int64_t, int>, std::vector<double>> copies_;
};

}  // namespace cleave
