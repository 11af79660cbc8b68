#include "cleave/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace cleave {

double learning_rate(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps) return cfg.lr * double(step + 1) / double(cfg.warmup_steps);
  if (cfg.decay == LrDecay::constant || total_steps <= cfg.warmup_steps) return cfg.lr;
  const double progress = std::min(
      1.0, double(step - cfg.warmup_steps) / double(std::max<int64_t>(1, total_steps - 1 - cfg.warmup_steps)));
  const double factor = cfg.decay == LrDecay::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress))
                                                     : 1.0 - progress;
  return cfg.min_lr + factor * (cfg.lr - cfg.min_lr);
}

}  // namespace cleave
