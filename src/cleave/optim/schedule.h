// Learning rate of step `step` (0-based): linear warmup, lr * (step + 1) / warmup_steps, then
// cosine or linear decay from lr to min_lr at the last step, total_steps - 1 (or constant lr).
// The exact formulas: docs/config.md, Learning-rate schedule.
#pragma once
#include <cstdint>

#include "cleave/optim/optim_config.h"

namespace cleave {

double learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace cleave
