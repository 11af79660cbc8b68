#include "cleave/optim/loss_scaler.h"

#include <algorithm>

namespace cleave {

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options)
    : o_(options), s_{options.initial, 0, options.hysteresis} {}

bool DynamicLossScaler::update(bool overflow) {
  if (!overflow) {
    if (++s_.good_steps == o_.growth_interval) {
      s_.good_steps = 0;
      s_.hysteresis_left = o_.hysteresis;
      s_.scale *= o_.growth_factor;
    }
    return true;
  }
  if (s_.scale <= o_.min) return false;
  s_.good_steps = 0;
  s_.hysteresis_left = std::max(s_.hysteresis_left - 1, 0);
  if (s_.hysteresis_left == 0) s_.scale = std::max(s_.scale * o_.backoff_factor, o_.min);
  return true;
}

}  // namespace cleave
