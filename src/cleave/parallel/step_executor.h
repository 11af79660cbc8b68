// Runs a rank's step program (pipeline/program.h) for every axis of the mesh: the model's units on
// activation slots, the point-to-point transfers between pipeline stages, the data- and
// tensor-parallel gradient work the program places between them, and the step's end
// (parallel/step_end.h). Transfers are posted where the program says and waited for by the
// compute that needs them, so they overlap compute; they go through the comm layer, with its
// timeouts and flight recorder.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/comm/group.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"
#include "cleave/parallel/step_end.h"
#include "cleave/parallel/tensor_parallel.h"
#include "cleave/pipeline/program.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

// The model's units as the lowering sees them.
UnitLayout unit_layout(const Transformer& model);

struct StepParts {
  Transformer* model = nullptr;
  std::vector<DataParallel*> dp;           // one per parameter group
  TensorParallelGrads* tp_grads = nullptr;  // tp > 1
  Group* pp = nullptr;                      // the rank's pipeline group
  Group* tied = nullptr;                    // first and last stage: the tied embedding's pair
  StepEnd* end = nullptr;                   // training programs: their last instructions
  int rank = 0;                             // world rank: the track of traced spans
  // Called with a unit before its gradients are reduced (fault injection in tests); may be empty.
  std::function<void(int unit)> before_reduce;
  // Called after every instruction (tests sample memory residency with it); may be empty.
  std::function<void()> after_instruction;
};

// One run of a program: its micro-batches, where their data comes from, and what its step's end
// needs to know.
struct StepRun {
  int64_t B = 0, T = 0;   // a micro-batch on this rank: B sequences of T tokens
  float grad_scale = 0;   // as Transformer::forward_unit
  bool trace = false;     // record a span per schedule action (name like "1F3") and step-end op
  // The micro-batch's descriptor (B x T tokens), for every chunk: the embeddings read its tokens,
  // attention its positions and documents, the head its targets and loss mask.
  std::function<void(int mb, Batch& batch)> fill;
  // Training programs: the step (from 0), its learning rate, and the valid tokens of the whole
  // step (over every rank holding a piece of it), which the loss is the mean of: the gradient's
  // scale is 1 / loss_tokens from the first backward on, so it is known before the step.
  int64_t step = 0;
  double lr = 0, loss_tokens = 0;
};

struct StepTimes {
  double loss_sum = 0;       // of the tokens whose loss this rank computed
  int64_t loss_tokens = 0;   // how many of them count (the loss mask's)
  double seconds = 0;        // the whole program
  double started = 0;        // when it started, steady-clock seconds (the trace's zero)
  double busy_seconds = 0;   // in compute instructions
  // pp's row: waiting for transfers between stages and the tied sum, and the bytes sent to
  // other stages and into the tied sum (as a ring).
  CommTraffic comm;
  std::vector<TraceEvent> trace;  // per schedule action and step-end op, when asked
  StepEndResult end;              // training programs
};

class StepExecutor {
 public:
  explicit StepExecutor(StepParts parts) : parts_(std::move(parts)) {}
  StepTimes run(const Program& program, const StepRun& run);

 private:
  StepParts parts_;
  std::vector<std::vector<Batch>> batches_;  // per chunk and slot
};

}  // namespace cleave
