// What a module keeps for one micro-batch's backward, in bytes, stated by the module from its
// shapes (the formula the run's activation memory is predicted from; docs/activation_memory.md):
// the part selective checkpointing keeps (the products' outputs and what attention needs), the
// part it frees and rebuilds without a product (norms' and activations' outputs, the bf16 or FP8
// copies of products' inputs), and what a deferred input half keeps for its weight half.
#pragma once
#include <cstdint>

namespace cleave {

struct SavedBytes {
  int64_t kept = 0, recomputable = 0, deferred = 0;
  int64_t whole() const { return kept + recomputable; }
  SavedBytes& operator+=(const SavedBytes& o) {
    kept += o.kept;
    recomputable += o.recomputable;
    deferred += o.deferred;
    return *this;
  }
};

constexpr int64_t kFloatBytes = 4;

}  // namespace cleave
