#include "cleave/pipeline/program.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "cleave/base/check.h"

namespace cleave {

const char* op_name(Op op) {
  static const char* const names[] = {
      "forward",       "backward",      "backward_input", "backward_weight", "send_forward",
      "recv_forward",  "send_backward", "recv_backward",  "copy_forward",    "copy_backward",
      "gather",        "prefetch",      "release",        "tied_sum",        "reduce_grads",
      "drop_activations", "recompute",
      "finish_grads",  "sum_loss",      "grad_norm",      "clip",            "update",
      "gather_params", "moe_stats",     "fp8_scales"};
  return names[int(op)];
}

std::string action_name(const Instruction& i) {
  char letter = 'W';
  switch (i.op) {
    case Op::forward: letter = 'F'; break;
    case Op::backward: letter = 'B'; break;
    case Op::backward_input: letter = 'I'; break;
    case Op::recompute: letter = 'R'; break;
    default: break;
  }
  return std::to_string(i.stage) + letter + std::to_string(i.mb);
}

std::string to_string(const Instruction& i) {
  std::ostringstream out;
  out << op_name(i.op);
  if (i.unit >= 0) out << " unit " << i.unit;
  if (i.chunk >= 0) out << " chunk " << i.chunk;
  if (i.slot >= 0) out << " slot " << i.slot;
  if (i.mb >= 0) out << " mb " << i.mb;
  if (i.peer >= 0) out << " peer " << i.peer << " tag " << i.tag;
  if (i.from_chunk >= 0) out << " from chunk " << i.from_chunk << " slot " << i.from_slot;
  if (i.group >= 0) out << " group " << i.group;
  return out.str();
}

std::vector<Instruction> step_end_instructions(int groups, bool moe_stats, bool fp8_scales) {
  std::vector<Instruction> end = {{Op::finish_grads}, {Op::sum_loss}, {Op::grad_norm}, {Op::clip}};
  for (int g = 0; g < groups; ++g) {
    Instruction update{Op::update}, gather{Op::gather_params};
    update.group = gather.group = g;
    end.push_back(update);
    end.push_back(gather);
  }
  if (moe_stats) end.push_back({Op::moe_stats});
  if (fp8_scales) end.push_back({Op::fp8_scales});
  return end;
}

namespace {

// Activation slots of each chunk: a micro-batch takes the lowest free one at its first use (its
// receive or forward) and gives it back after the last action on it (its last backward action,
// or the send that follows it; forward-only, once its output is handed on).
class Slots {
 public:
  Slots(int chunks, int microbatches)
      : of_(size_t(chunks), std::vector<int>(size_t(microbatches), -1)), free_(size_t(chunks)),
        count_(size_t(chunks), 0) {}
  int take(int chunk, int mb) {
    int& s = of_[size_t(chunk)][size_t(mb)];
    if (s >= 0) return s;
    std::set<int>& f = free_[size_t(chunk)];
    if (f.empty()) {
      s = count_[size_t(chunk)]++;
    } else {
      s = *f.begin();
      f.erase(f.begin());
    }
    return s;
  }
  int of(int chunk, int mb) const { return of_[size_t(chunk)][size_t(mb)]; }
  void give(int chunk, int mb) {
    free_[size_t(chunk)].insert(of(chunk, mb));
    of_[size_t(chunk)][size_t(mb)] = -1;
  }
  std::vector<int> counts() const {
    std::vector<int> c = count_;
    for (int& n : c) n = std::max(n, 1);
    return c;
  }

 private:
  std::vector<std::vector<int>> of_;
  std::vector<std::set<int>> free_;
  std::vector<int> count_;
};

}  // namespace

Program lower_schedule(const Schedule& s, const StageMap& stages, int rank,
                       const UnitLayout& layout, const LoweringOptions& options) {
  const int m = s.microbatches, last = s.n_stages - 1;
  const int chunks = int(layout.chunk_units.size());
  CLEAVE_CHECK(stages.chunks_per_rank == chunks,
               "the schedule gives each rank " << stages.chunks_per_rank << " chunks; the model has "
                                               << chunks);
  auto tag = [&](int dir, int stage, int mb) { return (dir * s.n_stages + stage) * m + mb; };
  auto local = [&](int stage) { return stages.rank_of_stage[size_t(stage)] == rank; };
  auto chunk = [&](int stage) { return stages.chunk_of_stage[size_t(stage)]; };
  auto checkpointed = [&](int unit) {
    return options.training && !options.checkpoint.empty() && options.checkpoint[size_t(unit)];
  };
  Slots slots(chunks, m);
  std::vector<Instruction> seq;
  // A micro-batch's slot of a chunk is given back after the last action naming the two.
  const std::vector<Action>& actions = s.ranks.at(size_t(rank));
  std::vector<std::vector<int>> last_use(size_t(chunks), std::vector<int>(size_t(m), -1));
  for (int k = 0; k < int(actions.size()); ++k)
    last_use[size_t(chunk(actions[size_t(k)].stage))][size_t(actions[size_t(k)].mb)] = k;

  // 1. Actions to unit instructions on slots, with the hand-overs between adjacent stages.
  for (int k = 0; k < int(actions.size()); ++k) {
    const Action& a = actions[size_t(k)];
    const int c = chunk(a.stage);
    const std::vector<int>& units = layout.chunk_units[size_t(c)];
    switch (a.type) {
      case ActionType::recv_forward:
        seq.push_back({Op::recv_forward, -1, c, slots.take(c, a.mb), a.mb,
                       stages.rank_of_stage[size_t(a.stage) - 1], tag(0, a.stage, a.mb)});
        break;
      case ActionType::forward: {
        const int slot = slots.take(c, a.mb);
        for (int u : units) {
          seq.push_back({Op::forward, u, c, slot, a.mb, -1, -1, -1, -1, a.stage});
          // A forward-only program (validation) keeps nothing for a backward that never comes:
          // each block's saved activations go as it ends, or validating an activation-
          // checkpointed run would refill every block's.
          if (checkpointed(u) || (!options.training && layout.has_weight_part[size_t(u)]))
            seq.push_back({Op::drop_activations, u, c, slot, a.mb});
        }
        if (a.stage < last && local(a.stage + 1)) {
          const int next = chunk(a.stage + 1);
          seq.push_back({Op::copy_forward, -1, next, slots.take(next, a.mb), a.mb, -1, -1, c, slot});
        }
        break;
      }
      case ActionType::send_forward:
        seq.push_back({Op::send_forward, -1, c, slots.of(c, a.mb), a.mb,
                       stages.rank_of_stage[size_t(a.stage) + 1], tag(0, a.stage + 1, a.mb)});
        break;
      case ActionType::recv_backward:  // may be posted before the stage's forward (m = 1)
        seq.push_back({Op::recv_backward, -1, c, slots.take(c, a.mb), a.mb,
                       stages.rank_of_stage[size_t(a.stage) + 1], tag(1, a.stage, a.mb)});
        break;
      case ActionType::backward:
      case ActionType::backward_input: {
        const int slot = slots.of(c, a.mb);
        const Op op = a.type == ActionType::backward ? Op::backward : Op::backward_input;
        for (auto u = units.rbegin(); u != units.rend(); ++u) {
          if (checkpointed(*u))
            seq.push_back({Op::recompute, *u, c, slot, a.mb, -1, -1, -1, -1, a.stage});
          seq.push_back({op, *u, c, slot, a.mb, -1, -1, -1, -1, a.stage});
          // What the recompute rebuilt goes once backward is done with it (after the weight
          // half when the backward is split).
          if (checkpointed(*u) && op == Op::backward)
            seq.push_back({Op::drop_activations, *u, c, slot, a.mb});
        }
        if (a.stage > 0 && local(a.stage - 1)) {
          const int previous = chunk(a.stage - 1);
          seq.push_back({Op::copy_backward, -1, previous, slots.of(previous, a.mb), a.mb, -1, -1,
                         c, slot});
        }
        break;
      }
      case ActionType::send_backward:
        seq.push_back({Op::send_backward, -1, c, slots.of(c, a.mb), a.mb,
                       stages.rank_of_stage[size_t(a.stage) - 1], tag(1, a.stage - 1, a.mb)});
        break;
      case ActionType::backward_weight: {
        const int slot = slots.of(c, a.mb);
        for (auto u = units.rbegin(); u != units.rend(); ++u) {
          if (layout.has_weight_part[size_t(*u)])
            seq.push_back({Op::backward_weight, *u, c, slot, a.mb, -1, -1, -1, -1, a.stage});
          if (checkpointed(*u)) seq.push_back({Op::drop_activations, *u, c, slot, a.mb});
        }
        break;
      }
    }
    if (last_use[size_t(c)][size_t(a.mb)] == k) slots.give(c, a.mb);
  }

  // 2. Each unit's gradients are reduced after the last instruction that writes them; the tied
  // copies' after the step's compute, once summed with the other stage's.
  std::vector<Instruction> with_grads;
  if (options.training) {
    const int n_units = int(layout.uses.size());
    auto writes = [&](const Instruction& i) {
      if (i.op == Op::backward) return true;
      const bool weight_part = layout.has_weight_part[size_t(i.unit)];
      return i.op == (weight_part ? Op::backward_weight : Op::backward_input);
    };
    std::vector<int> last_writer(size_t(n_units), -1);
    for (int k = 0; k < int(seq.size()); ++k)
      if (is_compute(seq[size_t(k)].op) && writes(seq[size_t(k)]))
        for (int v : layout.uses[size_t(seq[size_t(k)].unit)]) last_writer[size_t(v)] = k;
    auto tied = [&](int v) {
      return std::find(layout.tied_units.begin(), layout.tied_units.end(), v) !=
             layout.tied_units.end();
    };
    for (int k = 0; k < int(seq.size()); ++k) {
      with_grads.push_back(seq[size_t(k)]);
      // Several units finishing at one instruction are reduced from the highest down, the order
      // backward finishes them in.
      for (int v = n_units - 1; v >= 0; --v)
        if (last_writer[size_t(v)] == k && !tied(v)) with_grads.push_back({Op::reduce_grads, v});
    }
    if (!layout.tied_units.empty()) {
      with_grads.push_back({Op::tied_sum});
      for (auto v = layout.tied_units.rbegin(); v != layout.tied_units.rend(); ++v)
        with_grads.push_back({Op::reduce_grads, *v});
    }
  } else {
    with_grads = std::move(seq);
  }

  // 3. ZeRO-3: a unit's parameters are gathered before the compute that uses them (the next
  // compute's prefetched), and released once the next compute does not use them.
  Program p;
  if (!options.shard_parameters) {
    p.instructions = std::move(with_grads);
  } else {
    std::vector<int> next_compute(with_grads.size() + 1, -1);
    for (int k = int(with_grads.size()) - 1; k >= 0; --k)
      next_compute[size_t(k)] = is_compute(with_grads[size_t(k)].op) ? k : next_compute[size_t(k) + 1];
    std::set<int> resident, prefetched, to_release;
    for (int k = 0; k < int(with_grads.size()); ++k) {
      const Instruction& i = with_grads[size_t(k)];
      if (!is_compute(i.op)) {
        p.instructions.push_back(i);
        continue;
      }
      for (int v : to_release) p.instructions.push_back({Op::release, v});
      to_release.clear();
      const std::vector<int>& need = layout.uses[size_t(i.unit)];
      for (int v : need)
        if (resident.insert(v).second) {
          p.instructions.push_back({Op::gather, v});
          prefetched.erase(v);
        }
      const int next = next_compute[size_t(k) + 1];
      const std::vector<int> none;
      const std::vector<int>& next_need = next >= 0 ? layout.uses[size_t(with_grads[size_t(next)].unit)] : none;
      for (int v : next_need)
        if (!resident.count(v) && prefetched.insert(v).second)
          p.instructions.push_back({Op::prefetch, v});
      p.instructions.push_back(i);
      for (int v : need)
        if (std::find(next_need.begin(), next_need.end(), v) == next_need.end()) {
          to_release.insert(v);
          resident.erase(v);
        }
    }
    for (int v : to_release) p.instructions.push_back({Op::release, v});
  }
  if (options.training)
    for (const Instruction& i :
         step_end_instructions(options.parameter_groups, options.moe_stats, options.fp8_scales))
      p.instructions.push_back(i);
  p.slots = slots.counts();
  return p;
}

Schedule forward_only_schedule(const StageMap& stages, int pp, int microbatches) {
  Schedule s;
  s.name = "forward";
  s.pp = pp;
  s.n_stages = int(stages.rank_of_stage.size());
  s.microbatches = microbatches;
  s.ranks.resize(size_t(pp));
  const int last = s.n_stages - 1;
  for (int mb = 0; mb < microbatches; ++mb)
    for (int st = 0; st <= last; ++st) {
      const int r = stages.rank_of_stage[size_t(st)];
      auto& list = s.ranks[size_t(r)];
      if (st > 0 && stages.rank_of_stage[size_t(st) - 1] != r)
        list.push_back({ActionType::recv_forward, st, mb});
      list.push_back({ActionType::forward, st, mb});
      if (st < last && stages.rank_of_stage[size_t(st) + 1] != r)
        list.push_back({ActionType::send_forward, st, mb});
    }
  return s;
}

}  // namespace cleave
