// The routing a run measured, for `cleave plan --routing RUN_DIR`: ep's bytes and the experts'
// rows depend on which experts the router picks, and the plan otherwise takes it as balanced.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"

namespace cleave {

struct ExpertRouting {
  // Per MoE layer, per expert: the share of the layer's choices (tokens x top_k) it kept. The
  // shares sum to the kept fraction (1 unless a capacity dropped choices).
  std::map<int, std::vector<double>> share;
  // The same per logged record (an interval's mean): a rank's buffers keep their largest size,
  // so its memory follows the record that gives it the most rows.
  std::vector<std::map<int, std::vector<double>>> records;
  std::string source;  // the metrics file read
  int64_t steps = 0;   // the steps its figures are the mean of
};

// The mean routing of the run in `run` (its folder or its metrics.jsonl) over its logged steps:
// the trainer logs each MoE layer's rows per expert and choices dropped (`moe_layers`). Throws
// Error naming the file and line for a file that is not a run of `model` (no such layers, another
// expert count, a layer `model` has no MoE in).
ExpertRouting read_routing(const std::string& run, const ModelConfig& model);

// Per expert of `layer`, the share of its choices `routing` gives it; balanced (each expert
// 1 / E, nothing dropped) where `routing` is null or has no figures for the layer.
std::vector<double> expert_shares(const ExpertRouting* routing, int layer, int experts);

// The share of `layer`'s choices kept for the busiest ep rank's experts (ep rank i holds the i-th
// 1 / ep of them), in each record, the mean over records: the ranks meet at the all-to-all after
// the experts, so each waits there for the one with the most rows, and which one that is
// changes from layer to layer and step to step. Balanced where null or without figures.
double busiest_rank_share(const ExpertRouting* routing, int layer, int experts, int ep);

// The largest share of `layer`'s choices that any record of `routing` kept for experts [first,
// first + count) (all experts: the kept fraction); balanced where null or without figures.
double peak_share(const ExpertRouting* routing, int layer, int experts, int first, int count);

}  // namespace cleave
