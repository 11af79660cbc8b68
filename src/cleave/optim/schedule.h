// Learning rate at a step: linear warmup from 0 to lr over warmup_steps, then cosine or linear
// decay to min_lr at total_steps (or constant).
#pragma once
#include <cstdint>

#include "cleave/train/config.h"

namespace cleave {

double learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace cleave
