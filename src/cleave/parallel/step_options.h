// The [train] keys that shape a step, as the layout and the step program read them.
#pragma once
#include <string>

#include "cleave/kernels/linear.h"
#include "cleave/parallel/fp8_scaling.h"

namespace cleave {

// What one training step runs, beyond the model and the mesh: the batch, and what the step's
// program does with it (the [train] keys the layout and the program read; train/config.h's
// TrainConfig holds them).
struct StepOptions {
  int seq_len = 256;
  int micro_batch_size = 4;
  int grad_accum_steps = 1;  // the pipeline's micro-batches per step
  // Activation checkpointing: "none", or "full" (a checkpointed block keeps only its input and
  // runs its forward again before its backward), on every ac_every-th block (layers 0, N, 2N...).
  std::string activation_checkpointing = "none";
  int ac_every = 1;
  Precision dtype = Precision::fp32;
  // dtype "fp8" only: the recipe and its scaling (train.fp8_recipe, _margin,
  // _amax_history_len, _amax_compute_algo).
  Fp8Options fp8;
};

}  // namespace cleave
