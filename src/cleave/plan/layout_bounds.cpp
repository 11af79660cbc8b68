#include "cleave/plan/layout_bounds.h"

#include <algorithm>
#include <optional>

#include "cleave/base/check.h"
#include "cleave/model/transformer.h"
#include "cleave/plan/memory.h"
#include "cleave/plan/step_time.h"
#include "cleave/plan/step_work.h"

namespace cleave {

namespace {

// The sequences of a micro-batch on one data-parallel rank.
int64_t local_batch(const ParallelConfig& parallel, const StepOptions& step) {
  return step.micro_batch_size / (parallel.dp_replicate * parallel.dp_shard);
}

// Each stage's positions in forward order (the embedding 0, layer l at l + 1, the head last) as
// [first, end) of stage_layers' layers.
std::vector<std::pair<int, int>> stage_positions(const PipelinePlan& pipeline) {
  std::vector<std::pair<int, int>> out;
  const size_t stages = pipeline.stage_layers.size();
  int layer = 0;
  for (size_t k = 0; k < stages; ++k) {
    const int end = layer + pipeline.stage_layers[k];
    out.push_back({k == 0 ? 0 : layer + 1, k + 1 == stages ? end + 2 : end + 1});
    layer = end;
  }
  return out;
}

double sum(const std::vector<double>& v, std::pair<int, int> range) {
  double s = 0;
  for (int i = range.first; i < range.second; ++i) s += v[size_t(i)];
  return s;
}

}  // namespace

LayoutBounds::LayoutBounds(const ModelConfig& model, std::string optimizer_offload, int world,
                           const Cluster& cluster)
    : model_(model), optimizer_offload_(std::move(optimizer_offload)), world_(world),
      cluster_(cluster) {}

const LayoutBounds::UnitCosts& LayoutBounds::unit_costs(const ParallelConfig& parallel,
                                                        const StepOptions& step) {
  // The probe's groups are pp rank 0's; pp rank r's are theirs moved by r x (world / pp) ranks,
  // on links of the same class when hosts hold whole multiples of world / pp or divide it; else
  // the bound leaves the collectives out.
  const int per_host = std::max(1, cluster_.devices_per_host), rest = world_ / parallel.pp;
  const bool same_links = rest % per_host == 0 || per_host % rest == 0;
  // ep's groups are carved out of dp_shard x cp: where they sit depends on dp_shard too. A probe
  // of one rank has no compute_imbalance stretch (cost_work), one of more ranks has.
  const auto key = std::tuple{same_links,
                              rest > 1,
                              parallel.tp,
                              parallel.cp,
                              parallel.sequence_parallel,
                              step.activation_checkpointing,
                              local_batch(parallel, step),
                              parallel.ep,
                              parallel.ep > 1 ? parallel.dp_shard : 0};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = costs_.find(key);
    if (it != costs_.end()) return it->second;
  }
  UnitCosts made = probe(parallel, step, same_links);
  std::lock_guard<std::mutex> lock(mutex_);
  return costs_.try_emplace(key, std::move(made)).first->second;
}

LayoutBounds::UnitCosts LayoutBounds::probe(const ParallelConfig& parallel,
                                            const StepOptions& step, bool with_comms) const {
  UnitCosts c;
  // The same micro-batch on one pipeline rank, run once, under ZeRO-0: ZeRO-2/3 only add to a
  // unit's passes (packing after each gather, refaulting released memory), so the bound holds
  // for every stage.
  ParallelConfig p = parallel;
  p.zero_stage = 0;
  p.pp = 1;
  p.pp_layers.clear();
  p.pp_schedule = "1f1b";
  p.pp_virtual = 0;
  p.pp_schedule_csv.clear();
  StepOptions s = step;
  s.grad_accum_steps = 1;
  const int probe_world = world_ / parallel.pp;
  std::optional<Layout> layout;
  try {
    layout.emplace(layout_of(plan_mesh(model_, p, s, probe_world), plan_pipeline(model_, p, 1, 1)));
  } catch (const Error&) {
    return c;  // no probe: no bound
  }
  const StepWork work = step_work(model_, p, s, *layout, 0);
  const CostedWork costed = cost_work(work, *layout, cluster_);
  const size_t positions = size_t(model_.n_layers) + 2;
  c.forward.assign(positions, 0);
  c.all.assign(positions, 0);
  for (size_t i = 0; i < work.program.instructions.size(); ++i) {
    const Instruction& in = work.program.instructions[i];
    if (!is_compute(in.op)) continue;
    const InstructionCost& cost = costed.costs[i];
    double seconds = cost.compute;
    if (with_comms)
      for (const auto& part : cost.blocking) seconds += part.second;
    const size_t at = size_t(work.unit_layer[size_t(in.unit)] + 1);
    c.all[at] += seconds;
    if (in.op == Op::forward) c.forward[at] += seconds;
  }
  c.valid = true;
  return c;
}

const LayoutBounds::Planned& LayoutBounds::planned(int tp, bool sequence_parallel, bool selective,
                                                   Precision dtype) {
  const auto key = std::tuple{tp, sequence_parallel, selective, dtype};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = planned_.find(key);
    if (it != planned_.end()) return it->second;
  }
  Planned p;
  p.model = Transformer::planned(model_, tp, sequence_parallel, {}, dtype, 1);
  p.model->set_selective_recompute(selective);
  const ParamStore& store = p.model->params();
  p.floats.assign(size_t(store.n_groups()), std::vector<double>(size_t(model_.n_layers) + 2, 0));
  for (int u = 0; u < p.model->n_units(); ++u) {
    const size_t at = size_t(unit_layer(p.model->units()[size_t(u)], model_.n_layers) + 1);
    for (int g = 0; g < store.n_groups(); ++g)
      p.floats[size_t(g)][at] +=
          double(store.unit_bounds(g)[size_t(u) + 1] - store.unit_bounds(g)[size_t(u)]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_.try_emplace(key, std::move(p)).first->second;
}

const std::vector<double>& LayoutBounds::weight_copies(const Planned& p, int64_t rows, int ep) {
  const auto key = std::tuple{&p, rows, ep};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = copies_.find(key);
    if (it != copies_.end()) return it->second;
  }
  std::vector<double> copies(size_t(model_.n_layers) + 2, 0);
  const std::vector<LinearGemm::WeightCopies> per_unit =
      cleave::weight_copies(*p.model, rows, false, group_shares(p.model->params(), ep));
  for (size_t u = 0; u < per_unit.size(); ++u)
    copies[size_t(unit_layer(p.model->units()[u], model_.n_layers) + 1)] +=
        double(per_unit[u].total());
  std::lock_guard<std::mutex> lock(mutex_);
  return copies_.try_emplace(key, std::move(copies)).first->second;
}

double LayoutBounds::step_seconds(const ParallelConfig& parallel, const StepOptions& step,
                                  const PipelinePlan& pipeline) {
  const UnitCosts& c = unit_costs(parallel, step);
  if (!c.valid) return 0;
  const std::vector<std::pair<int, int>> stages = stage_positions(pipeline);
  const std::vector<int>& rank_of = pipeline.check.stages.rank_of_stage;
  double bound = 0, before = 0;  // before: the first micro-batch's forward up to stage k
  std::vector<double> start(size_t(parallel.pp), -1), busy(size_t(parallel.pp), 0);
  for (size_t k = 0; k < stages.size(); ++k) {
    const size_t r = size_t(rank_of[k]);
    if (start[r] < 0) start[r] = before;
    busy[r] += sum(c.all, stages[k]);
    before += sum(c.forward, stages[k]);
  }
  for (size_t r = 0; r < busy.size(); ++r)
    bound = std::max(bound, std::max(0.0, start[r]) + step.grad_accum_steps * busy[r]);
  return bound;
}

double LayoutBounds::memory_bytes(const ParallelConfig& parallel, const StepOptions& step,
                                  const PipelinePlan& pipeline) {
  const std::string& ac = step.activation_checkpointing;
  const Planned& p = planned(parallel.tp, parallel.sequence_parallel, ac == "selective", step.dtype);
  const std::vector<std::pair<int, int>> stages = stage_positions(pipeline);
  const std::vector<int>& rank_of = pipeline.check.stages.rank_of_stage;
  const int64_t B = local_batch(parallel, step);
  const int64_t T = step.seq_len / parallel.cp;
  const double dp = double(parallel.dp_replicate) * parallel.dp_shard * parallel.cp;
  // ZeRO-2/3 hold the whole gradient buffer while micro-batches accumulate (plan_memory).
  const bool accumulating = step.grad_accum_steps > 1 || parallel.pp > 1;
  const std::vector<double>& copies = weight_copies(p, B * T, parallel.ep);
  const std::vector<double> share = group_shares(p.model->params(), parallel.ep);
  struct Rank {
    double floats = 0, copies = 0, slots = 0, saved = 0;
  };
  std::vector<Rank> ranks(size_t(parallel.pp));
  int first_layer = 0;
  for (size_t k = 0; k < stages.size(); ++k) {
    Rank& r = ranks[size_t(rank_of[k])];
    for (size_t g = 0; g < p.floats.size(); ++g)
      r.floats += share[g] * sum(p.floats[g], stages[k]);
    // ZeRO-3 frees a unit's copies with its values, and its peak may fall where none are held.
    if (parallel.zero_stage < 3) r.copies += sum(copies, stages[k]);
    const int end_layer = first_layer + pipeline.stage_layers[k];
    const double in_flight = pipeline.check.max_in_flight[size_t(rank_of[k])]
                                                         [size_t(pipeline.check.stages.chunk_of_stage[k])];
    r.slots += in_flight * 4 *
               double(p.model->slot_floats({first_layer, end_layer, k == 0, k + 1 == stages.size()},
                                           B, T));
    // What the chunk's blocks keep after their forward: all they save, or checkpointing's part.
    double kept = 0;
    for (int l = first_layer; l < end_layer; ++l) {
      const SavedBytes b = p.model->block_saved_bytes(l + 1, B, T);
      kept += ac == "none" ? double(b.whole()) : ac == "selective" ? double(b.kept) : 0;
    }
    r.saved = std::max(r.saved, in_flight * kept);
    first_layer = end_layer;
  }
  double bound = 0;
  for (const Rank& r : ranks)
    bound = std::max(bound, resident_state(parallel, optimizer_offload_, r.floats, r.floats / dp,
                                           0, accumulating ? r.floats : 0)
                                    .total() +
                                r.copies + r.slots + r.saved);
  return bound;
}

}  // namespace cleave
