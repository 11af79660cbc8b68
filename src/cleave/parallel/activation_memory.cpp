#include "cleave/parallel/activation_memory.h"

#include <algorithm>
#include <map>
#include <utility>

namespace cleave {

ActivationMemory predict_activation_memory(const Transformer& model, const Program& program,
                                           int64_t B, int64_t T, bool selective) {
  enum class Held { nothing, kept, whole };
  struct Set {
    Held held = Held::nothing;
    bool deferred = false;  // a deferred input half's buffers, allocated
  };
  std::map<std::pair<int, int>, Set> sets;  // by (unit, slot)
  std::map<int, SavedBytes> bytes;          // by unit
  ActivationMemory out;
  out.slots = model.slot_bytes(B, T, program.slots);
  // Freed sets go to the model's spares and stay allocated (model/spare_buffers.h): the memory
  // they take is the most they ever took at once. A full drop frees a deferred half's buffers.
  int64_t spared_peak = 0, held = 0, deferred = 0;  // held and deferred: now, over every set
  int whole = 0, kept = 0;
  auto count = [&](const Set& set, const SavedBytes& b, int sign) {
    if (set.held == Held::whole) held += sign * b.whole(), whole += sign;
    if (set.held == Held::kept) held += sign * b.kept, kept += sign;
    if (set.deferred) deferred += sign * b.deferred;
  };
  for (const Instruction& i : program.instructions) {
    if (i.unit < 0 || model.units()[size_t(i.unit)].kind != Transformer::UnitKind::block) continue;
    if (!bytes.count(i.unit)) bytes[i.unit] = model.block_saved_bytes(i.unit, B, T);
    const SavedBytes& b = bytes[i.unit];
    Set& s = sets[{i.unit, i.slot}];
    const Set before = s;
    switch (i.op) {
      case Op::forward:
      case Op::recompute: s.held = Held::whole; break;
      case Op::backward_input: s.deferred = true; break;
      case Op::drop_activations:
        s.held = selective ? Held::kept : Held::nothing;
        if (!selective) s.deferred = false;
        break;
      default: continue;
    }
    count(before, b, -1);
    count(s, b, +1);
    spared_peak = std::max(spared_peak, held);
    if (spared_peak + deferred > out.saved) {
      out.saved = spared_peak + deferred;
      out.sets_whole = whole;
      out.sets_kept = kept;
    }
  }
  return out;
}

}  // namespace cleave
