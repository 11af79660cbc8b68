// The end of a training step: what runs after the step program's last backward, as instructions
// of that program (pipeline/program.h, the step-end ops) so that a new precision or memory tool
// adds or changes an instruction here, not a closure in the trainer. In order: every parameter
// group's gradients finished (the data-parallel reductions waited for), the loss summed over
// the ranks that hold pieces of the batch, the global gradient norm and its non-finite check,
// the clip factor, each group's update, each group's parameters gathered (ZeRO-1/2). Every
// number it computes is the same on every rank. Under fp16's loss scaler the gradients hold
// scale x their values: the norm is divided by the scale, the update multiplies the gradients by
// clip / scale, and a step whose gradients overflowed updates nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/model/params.h"
#include "cleave/optim/adamw.h"
#include "cleave/optim/loss_scaler.h"
#include "cleave/parallel/comm_meter.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"
#include "cleave/parallel/fp8_scaling.h"
#include "cleave/parallel/tensor_parallel.h"

namespace cleave {

// The mean token loss of a batch held in pieces: each rank's summed losses and valid tokens,
// summed over `batch` and then over the pipeline `pp` (null: none; only its last stage has
// losses), in that order, the seconds waited on pp added to *waited_pp when given.
struct LossSum {
  double loss = 0, tokens = 0;
  double mean() const { return loss / tokens; }
};
LossSum sum_losses(Group& batch, Group* pp, double loss_sum, double tokens,
                   double* waited_pp = nullptr);

struct StepEndGroup {
  DataParallel* dp = nullptr;
  AdamW* optim = nullptr;
  Group* shard = nullptr;  // the ranks its ZeRO shards are spread over
  Group* spread = nullptr;  // the ranks holding other tensors of the group (the experts' ep)
};

struct StepEndParts {
  ParamStore* params = nullptr;
  std::vector<StepEndGroup> groups;         // per parameter group, in the store's order
  Group* batch = nullptr;                   // the ranks holding pieces of the batch
  Group* pp = nullptr;                      // the pipeline stages (null: none)
  TensorParallelGrads* tp_grads = nullptr;  // tp > 1
  int zero_stage = 0;
  double grad_clip = 0;                     // 0: no clipping
  DynamicLossScaler* scaler = nullptr;      // fp16: the scale the step's gradients were made at
  Transformer* model = nullptr;             // moe_stats: the MoE layers it holds
  Fp8Scaling* fp8 = nullptr;                // fp8_scales: FP8 with per-tensor scales
};

// What one step's end found, and the seconds it waited on each axis.
struct StepEndResult {
  double loss = 0, grad_norm = 0, clip = 1;
  double loss_scale = 1;  // the scale this step's gradients were made at (1 without a scaler)
  bool skipped = false;   // its gradients overflowed: nothing was updated
  CommTraffic comm;       // the seconds waited on each axis
};

class StepEnd {
 public:
  explicit StepEnd(StepEndParts parts) : p_(std::move(parts)) {}

  // The step's instructions, in the program's order; begin resets the result.
  void begin(int64_t step);
  void finish_gradients();
  // The mean over the step's valid tokens: this rank's summed token losses and valid tokens,
  // each summed over the ranks holding pieces of the batch. Their sum must be `expected`, the
  // count the gradients were scaled by before the step.
  void sum_loss(double loss_sum, double tokens, double expected);
  // Every rank alike: a non-finite loss or norm stops the run before anything is applied, naming
  // the step and the first tensor whose gradient holds a non-finite value. Under the loss scaler
  // a non-finite norm skips the step instead (the scaler updated here), unless the scale is
  // already its smallest.
  void grad_norm();
  void clip();
  void update(int group, double lr);
  void gather_parameters(int group);
  // The step's routing statistics of the model's MoE layers, summed over the ranks holding pieces
  // of the batch, and (but on a skipped step) sigmoid_bias's update from them.
  void moe_stats();
  // FP8's per-tensor scales: the step's amaxes reduced over the world, the next step's scales.
  void fp8_scales();
  // The last step's MoE layers' statistics, as moe_stats summed them.
  const std::vector<MoeLayerStats>& moe_layer_stats() const { return moe_; }

  const StepEndResult& result() const { return r_; }

 private:
  [[noreturn]] void stop_non_finite();

  StepEndParts p_;
  std::vector<DataParallel::OptimizerInputs> shards_;  // per group, after finish_gradients
  int64_t step_ = 0;
  StepEndResult r_;
  std::vector<MoeLayerStats> moe_;
};

}  // namespace cleave
