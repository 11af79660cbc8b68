// fp16's dynamic loss scaler. The loss's gradient is multiplied by `scale` before backward so that
// small gradients survive fp16's narrow range, and the update divides it out again. A step whose
// gradients overflowed (an inf or NaN anywhere) is skipped and, once `hysteresis` overflows have
// come since the last growth, the scale backs off; after `growth_interval` steps in a row without
// one it grows. These are Megatron-LM's DynamicGradScaler rules (its hysteresis) with PyTorch's
// GradScaler defaults for the rest.
#pragma once
#include <cstdint>

namespace cleave {

struct LossScalerOptions {
  double initial = 65536;  // 2^16
  double growth_factor = 2;
  int64_t growth_interval = 2000;
  double backoff_factor = 0.5;
  int hysteresis = 2;
  double min = 1;  // an overflow at this scale stops the run: nothing smaller would help
};

// Everything a resumed run needs to continue bitwise.
struct LossScalerState {
  double scale = 0;
  int64_t good_steps = 0;  // since the last growth or overflow
  int hysteresis_left = 0;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerOptions& options);

  double scale() const { return s_.scale; }
  const LossScalerState& state() const { return s_; }
  void restore(const LossScalerState& state) { s_ = state; }

  // After a step's gradients were checked, on every rank alike. false when an overflow came at
  // the smallest scale (the caller stops).
  bool update(bool overflow);

 private:
  LossScalerOptions o_;
  LossScalerState s_;
};

}  // namespace cleave
