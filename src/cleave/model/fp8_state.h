// What FP8 with per-tensor scales keeps between steps, as a checkpoint saves it: per FP8 linear
// (by weight name, sorted) its three scales (x, W, dy) and, under delayed scaling, the history of
// its amaxes. parallel/fp8_scaling.h keeps it; checkpoint/training_state.h stores it as a binary
// file of the checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

struct Fp8ScalingState {
  bool delayed = false;             // the history is kept (and restored) only then
  std::vector<std::string> names;   // sorted
  std::vector<float> scales;        // 3 per name
  std::vector<float> history;       // steps x names x 3, the oldest step first
  int64_t steps() const {
    return names.empty() ? 0 : int64_t(history.size() / (3 * names.size()));
  }
};

}  // namespace cleave
