// What one mesh axis's communication cost a rank: the seconds it waited on the axis's collectives
// (its exposed communication) and the bytes it sent into them. The model's communicators for tp,
// cp and ep each keep one; the trainer takes both figures per step.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>

#include "cleave/comm/group.h"

namespace cleave {

class CommMeter {
 public:
  double take_exposed_seconds() { return std::exchange(exposed_, 0.0); }
  int64_t take_bytes() { return std::exchange(bytes_, int64_t(0)); }

 protected:
  void sent(int64_t bytes) { bytes_ += bytes; }
  // What to call to wait for the work, the wait counted as exposed.
  std::function<void()> waiter(Work work) {
    return [this, work]() mutable { exposed_ += work.wait(); };
  }
  std::function<void()> waiter(Work a, Work b) {
    return [this, a, b]() mutable { exposed_ += a.wait() + b.wait(); };
  }
  void waited(double seconds) { exposed_ += seconds; }

 private:
  double exposed_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace cleave
