// A rank's step program: its schedule actions lowered to instructions on units of parameters
// and activation slots, with the data-parallel work placed between them (docs/pipeline_parallel.md,
// Step programs). A forward of a stage becomes each of the stage's units' forwards, a backward
// each unit's backward in reverse; ZeRO-3's gathers, prefetches and releases go around the units
// that use the parameters; each unit's gradient reduction follows the last compute that writes
// its gradients in the step, and the step's end follows the last of them. Without pipeline
// parallelism the program is the familiar loop: forward and backward per micro-batch, gradients
// reduced during the last backward. Pure data: no MPI.
#pragma once
#include <string>
#include <vector>

#include "cleave/pipeline/schedule.h"

namespace cleave {

enum class Op {
  forward,          // unit, chunk, slot, mb
  backward,         // unit, chunk, slot: input and weight gradients
  backward_input,   // unit, chunk, slot
  backward_weight,  // unit, chunk, slot
  send_forward,     // chunk, slot, mb, peer, tag: the chunk's output activations
  recv_forward,     // chunk, slot, mb, peer, tag: into the chunk's input
  send_backward,    // chunk, slot, mb, peer, tag: the gradient of the chunk's input
  recv_backward,    // chunk, slot, mb, peer, tag: into the gradient of the chunk's output
  copy_forward,     // chunk, slot <- from_chunk, from_slot: adjacent stages on one rank
  copy_backward,    // chunk, slot <- from_chunk, from_slot: the gradient, likewise
  gather,           // unit: its parameters, waited for
  prefetch,         // unit: its parameters' gather started
  release,          // unit: its parameters freed
  tied_sum,         // the tied embedding's gradient summed with the other stage's copy
  reduce_grads,     // unit: its gradients are final in this step
  // Activation checkpointing: a block's saved activations freed after its forward, and rebuilt
  // by running its forward again just before its backward needs them.
  drop_activations,  // unit, chunk, slot, mb
  recompute,         // unit, chunk, slot, mb
  // The step's end (parallel/step_end.h), after every other instruction of a training program:
  finish_grads,     // every group's data-parallel reductions complete
  sum_loss,         // the step's loss over every rank holding a piece of the batch
  grad_norm,        // the global gradient norm, and the non-finite check
  clip,             // the clip factor from the norm
  update,           // group: the optimizer updates the group's parameters
  gather_params,    // group: ZeRO-1/2 gather the updated parameters
  moe_stats,        // MoE: the routing statistics summed over the batch, the router biases' update
  fp8_scales,       // FP8 per-tensor scaling: the amaxes reduced, the next step's scales
};
const char* op_name(Op op);
inline bool is_compute(Op op) {
  return op == Op::forward || op == Op::backward || op == Op::backward_input ||
         op == Op::backward_weight || op == Op::recompute;
}
inline bool is_step_end(Op op) { return op >= Op::finish_grads; }

struct Instruction {
  Op op = Op::forward;
  int unit = -1, chunk = -1, slot = -1, mb = -1;
  int peer = -1, tag = -1;             // send/recv: the peer's pp rank and the message tag
  int from_chunk = -1, from_slot = -1;  // copies
  int stage = -1;                       // compute: the schedule action's stage
  int group = -1;                       // update, gather_params: the parameter group
};

// What the lowering needs to know of the rank's model: its units, chunk by chunk.
struct UnitLayout {
  std::vector<std::vector<int>> chunk_units;  // in forward order
  std::vector<std::vector<int>> uses;         // per unit: the units whose parameters it uses
  std::vector<bool> has_weight_part;          // per unit: backward_weight does work (blocks)
  std::vector<int> tied_units;                // units holding a tied copy shared with another stage
};

struct LoweringOptions {
  bool shard_parameters = false;  // ZeRO-3: gather before use, release after
  bool training = true;           // false: forward-only (validation), no gradient work
  int parameter_groups = 1;       // training: each updated and gathered at the step's end
  // training: per unit, whether its activations are checkpointed (dropped after its forward,
  // recomputed before its backward); empty: none.
  std::vector<bool> checkpoint;
  // training: the step's end also sums the MoE layers' routing statistics (the model has MoE
  // layers) and updates FP8's per-tensor scales (delayed or current scaling).
  bool moe_stats = false, fp8_scales = false;
};

struct Program {
  std::vector<Instruction> instructions;
  std::vector<int> slots;  // activation slots each chunk needs
};

// Lowers `rank`'s list of `s` (already checked) on a model of `layout`.
Program lower_schedule(const Schedule& s, const StageMap& stages, int rank,
                       const UnitLayout& layout, const LoweringOptions& options);

// The instructions that end a training step over `groups` parameter groups, in order.
std::vector<Instruction> step_end_instructions(int groups, bool moe_stats = false,
                                               bool fp8_scales = false);

// A forward-only schedule over the stages (validation): every micro-batch through every stage.
Schedule forward_only_schedule(const StageMap& stages, int pp, int microbatches);

std::string to_string(const Instruction& i);
// A compute instruction's schedule action, as the traces name it: stage, letter (F forward,
// B backward, I and W its input and weight halves, R a recompute), micro-batch: "1F3". A
// schedule action's units are consecutive compute instructions of the same action.
std::string action_name(const Instruction& i);
inline bool same_action(const Instruction& a, const Instruction& b) {
  return a.op == b.op && a.stage == b.stage && a.mb == b.mb;
}

}  // namespace cleave
