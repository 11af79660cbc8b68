// FP8's per-tensor scales between steps (docs/precision.md#fp8): Transformer Engine's
// DelayedScaling, and a record of the current recipe's. Every step each linear's products record
// the largest magnitude of each operand (x, W, dy); at the step's end those are reduced to their
// largest over every rank, appended to a history of amax_history_len steps, and the next step's
// scales are fp8_max / amax / 2^margin, amax the history's largest ("max") or latest
// ("most_recent"); a slot whose amax is 0 keeps its scale (1 at first).
//
// The reduction runs over the whole world, one slot per linear of the whole model by name: tp
// and FSDP shards of a weight, the cp chunks and data-parallel slices of a batch and an expert's
// ep owner all add to the slot of the tensor they hold parts of, so every rank, and one process
// running the same batch, takes the same scales (Megatron's amax reduction group is the ranks of
// a stage likewise; its PR #442 fixed a divergence where tp shards were left out).
//
// Current scaling keeps no state: each product takes its scales from its own operands, the amax
// completed over the tp and cp ranks in the product (model/fp8_amax.h). step_end records the
// scales of each linear's latest products, the largest over the ranks by name, for the
// checkpoint's meta.json only: with tp or cp alone every rank took one process's scales, so a
// layout's record is one process's (fp8_recipes_test.sh checks it after one step).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/comm/group.h"
#include "cleave/kernels/fp8.h"
#include "cleave/kernels/linear.h"
#include "cleave/model/fp8_state.h"

namespace cleave {

struct Fp8Options {
  kernels::Fp8Recipe recipe = kernels::Fp8Recipe::delayed;
  int margin = 0;
  int64_t amax_history_len = 1024;
  bool amax_most_recent = false;  // "most_recent" rather than "max"
  // Delayed or current scaling: per-tensor scales, which Fp8Scaling keeps between steps.
  bool per_tensor() const {
    return recipe == kernels::Fp8Recipe::delayed || recipe == kernels::Fp8Recipe::current;
  }
};

class Fp8Scaling {
 public:
  // Collective over world. gemms: this rank's FP8 linears by weight name.
  Fp8Scaling(Group& world, std::vector<std::pair<std::string, LinearGemm*>> gemms,
             const Fp8Options& options);
  // After a step's backward (collective): delayed, the reduction, the history, the next step's
  // scales; current, the record of the step's.
  void step_end();
  // Drops what products recorded outside training steps (validation's forwards), but the
  // weights': the next step multiplies the same weights, and builds their FP8 images only once.
  void discard();
  // Checkpoints: the scales and (delayed) the history by tensor name (rank 0 writes it; every rank
  // holds all of it). Only delayed scaling restores it; `where` names the checkpoint in errors.
  Fp8ScalingState state() const;
  void restore(const Fp8ScalingState& state, const std::string& where);
  bool delayed() const { return options_.recipe == kernels::Fp8Recipe::delayed; }

 private:
  void apply_scales();

  Group& world_;
  Fp8Options options_;
  std::vector<std::string> names_;              // every FP8 linear of the model, sorted
  std::vector<std::pair<int, LinearGemm*>> mine_;  // slot of each of this rank's
  std::vector<std::vector<float>> history_;     // per step (newest last), 3 floats per slot
  std::vector<float> scales_;                   // 3 per slot
  std::vector<float> weight_amax_;              // per slot: recorded by discard() for the step
};

}  // namespace cleave
