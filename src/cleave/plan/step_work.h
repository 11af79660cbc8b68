// What one rank's training step does, instruction by instruction: the matrix products, attention
// and element-wise bytes of each compute instruction, and every collective each instruction takes
// part in, with its mesh axis, kind and size. The one model of a step's communication: the bytes
// per axis that `cleave mesh`, `cleave plan` and the trainer's predicted figures give are its sums
// (plan/axis_volume.h), and the planner's step time is its simulation (plan/step_time.h), both
// walked from the lowered program the trainer runs (training_program).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/comm_meter.h"
#include "cleave/parallel/layout.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"
#include "cleave/plan/routing.h"
#include "cleave/pipeline/program.h"
#include "cleave/plan/cluster.h"

namespace cleave {

// One collective as collective_seconds takes it: `bytes` is all_reduce's buffer, all_gather's
// gathered output, reduce_scatter's input, all_to_all's send buffer, send_recv's message.
struct CommCall {
  CommAxis metered = CommAxis::dp;  // the trainer's row of measured traffic
  std::string axis;                 // the axis it is reported on: "tp", "dp_shard x cp", "efsdp"...
  std::vector<std::string> group;   // the mesh axes whose ranks take part (carved ones by name)
  Collective kind = Collective::all_reduce;
  double bytes = 0;
  int ranks = 1;
  std::string what;  // what it moves, for the report: "a block's activations"
  // Posted by its instruction and waited for later (gradient reductions, ZeRO-3's prefetches,
  // pipeline sends), else waited for by the instruction itself.
  bool overlapped = false;
  int peer = -1;  // send_recv over pp: the receiving stage's pp rank
  // Run this many times one after another (a ring's steps): one call, so that a ring over
  // thousands of cp ranks costs one entry, not thousands, per layer and micro-batch.
  int repeats = 1;
  double sent() const { return repeats * ring_bytes_sent(kind, bytes, ranks); }  // all repeats
};

// C[m, n] = A[m, k] B[k, n] in `dtype`, `count` times.
struct GemmCall {
  int64_t m = 0, n = 0, k = 0;
  Precision dtype = Precision::fp32;
  double count = 1;
};

struct InstructionWork {
  std::vector<GemmCall> gemms;      // the linears' products
  // Products of another rank that this one waits for: the rows by which the busiest ep rank's
  // experts exceed this rank's (busiest_rank_share), costed as products, not counted as FLOPs.
  std::vector<GemmCall> waited;
  // Causal attention's products, run by its own kernel: one head's scores over one sequence
  // (m = the rank's queries, n = the keys, k = head_dim) as often as its FLOPs make full products.
  std::vector<GemmCall> attention;
  double elementwise_bytes = 0;  // read and written by the activations' element-wise kernels
  double fp8_bytes = 0;          // by FP8's kernels beside its products (kernels::fp8_traffic)
  // Streamed once per parameter by the step's end: the optimizer's update, the gradient norm's
  // reads, the gradients zeroed for the next step.
  double stream_bytes = 0;
  // The products' copies of weights written anew (LinearGemm::weight_copy_bytes): at the update
  // (ZeRO-0), at ZeRO-1/2's gather of the updated shards, at every ZeRO-3 product pass.
  double pack_bytes = 0;
  // Memory ZeRO-2/3 returned to the system that this instruction writes again: a unit's
  // gradients where the step first writes them, its parameters at each gather; in
  // buffers of huge pages or not (kHugePageBufferBytes).
  double refault_bytes = 0;
  bool refault_huge = false;
  std::vector<CommCall> comms;
  double flops() const;          // of the products and attention
};

struct StepWork {
  int pp_rank = 0;
  // The rank's model as the trainer builds it (Transformer::planned: shapes, no values), which
  // plan_memory reads too.
  std::shared_ptr<Transformer> model;
  Program program;
  // Per instruction of program; instructions that do the same work (a unit's forward on every
  // micro-batch) share one.
  std::vector<std::shared_ptr<const InstructionWork>> work;
  // Per unit of the rank's model, its place in forward order: the embedding -1, a block its
  // layer, the head n_layers.
  std::vector<int> unit_layer;
  // Per parameter group of model, the share of it this rank holds: the planned model has every
  // expert, a rank 1 / ep of them.
  std::vector<double> group_share;
  double model_flops = 0;             // per step on this rank, as MFU counts them
};

// A unit's place in forward order, as StepWork::unit_layer gives it: the embedding -1, a block
// its layer, the head n_layers.
inline int unit_layer(const Transformer::Unit& unit, int n_layers) {
  if (unit.kind == Transformer::UnitKind::embedding) return -1;
  return unit.kind == Transformer::UnitKind::head ? n_layers : unit.layer;
}

// The floats per token a block's element-wise kernels read and write in its forward (twice as
// many backward): two norms and two residual adds over the stream (10 d_model), the MLP's
// activation over its hidden units (GPT-2's GELU 2 hidden, SwiGLU 3), and Llama's RoPE, which
// reads and writes the queries and keys in place (taken as d_model columns each: 4 d_model).
// `cleave calibrate` measures the element-wise rate on these counts.
double block_elementwise_floats(Family family, double d_model, double hidden);

// Per parameter group of `store` (a planned model's, which has every expert), the share of it a
// rank holds under expert parallelism `ep`: 1 / ep of the experts, the rest whole.
std::vector<double> group_shares(const ParamStore& store, int ep);

// Per unit (by_group false) or per parameter group (true) of `model`, the copies its linears'
// products keep of their weights on micro-batches of `rows` rows on a rank
// (LinearGemm::weight_copy_bytes of each weight a product packs), each group's taken at its
// share (StepWork::group_share; whole where empty).
std::vector<LinearGemm::WeightCopies> weight_copies(const Transformer& model, int64_t rows,
                                                    bool by_group,
                                                    const std::vector<double>& group_share = {});

// pp rank `pp_rank`'s step (its tp rank 0 and data-parallel rank 0 stand for the others, which do
// as much), with MoE routing as `routing` measured it (plan/routing.h), or balanced where null.
// Under ep the rank is ep rank `ep_rank`, which holds the ep_rank-th 1 / ep of the experts, and
// each rank is taken to route its tokens as the whole batch does.
StepWork step_work(const ModelConfig& model, const ParallelConfig& parallel,
                   const StepOptions& step, const Layout& layout, int pp_rank,
                   const ExpertRouting* routing = nullptr, int ep_rank = 0);

}  // namespace cleave
