#include "cleave/plan/memory.h"

#include <algorithm>
#include <functional>

#include "cleave/model/moe.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/axis_table.h"
#include "cleave/parallel/data_parallel.h"
#include "cleave/parallel/step_executor.h"

namespace cleave {

namespace {

// The sum of the `n` largest of `v`: ZeRO-3's weight copies (the unit in use and the one
// prefetched), and ZeRO-2/3's full gradients (the unit backward writes and the two whose
// reduce-scatters DataParallel keeps in flight).
int64_t largest(std::vector<int64_t> v, int n) {
  std::sort(v.begin(), v.end(), std::greater<>());
  int64_t sum = 0;
  for (int i = 0; i < n && i < int(v.size()); ++i) sum += v[size_t(i)];
  return sum;
}

}  // namespace

ModelState model_state(const StateRecipe& recipe, int zero, double all, double shard,
                       double gathered, double reducing) {
  ModelState s;
  s.values = recipe.values * (zero < 3 ? all : shard + gathered);
  s.gradients = recipe.gradients * (zero < 2 ? all : shard + reducing);
  s.optimizer = recipe.optimizer * (zero == 0 ? all : shard);
  return s;
}

ModelState resident_state(const ParallelConfig& parallel, const std::string& optimizer_offload,
                          double all, double shard, double gathered, double reducing) {
  const int zero = parallel.zero_stage;
  ModelState s = model_state(StateRecipe{}, zero, all, shard, gathered, reducing);
  if (parallel.offload_params == "file" && zero == 3) s.values -= StateRecipe{}.values * shard;
  if (optimizer_offload == "file") s.optimizer = 0;
  return s;
}

MemoryPlan plan_memory(const ModelConfig& model, const ParallelConfig& parallel,
                       const StepOptions& step, const std::string& optimizer_offload,
                       const Layout& layout, const StepWork& work, int val_batches) {
  const int pp_rank = work.pp_rank;
  const Mesh& mesh = layout.mesh;
  const int cp = mesh.degree(Axis::cp), pp = mesh.degree(Axis::pp);
  const int zero = parallel.zero_stage;
  MemoryPlan plan;
  plan.pp_rank = pp_rank;
  // The model as the trainer builds it on this rank (step_work's): its stages' tp share, units
  // padded to equal shards over dp_shard x cp.
  Transformer& m = *work.model;
  const ParamStore& store = m.params();
  plan.parameter_count = store.global_count();
  const AxisTable axes = axis_table(store, mesh);

  // Per unit, its flat size over every group; per group, this rank's shard of it (of the share
  // of the group the rank holds: 1 / ep of the experts).
  std::vector<int64_t> unit_floats(size_t(m.n_units()), 0);
  int64_t shard_floats = 0, all = 0, experts = 0;
  for (int g = 0; g < store.n_groups(); ++g) {
    const std::vector<int64_t>& b = store.unit_bounds(g);
    const double share = work.group_share[size_t(g)];
    for (size_t u = 0; u + 1 < b.size(); ++u)
      unit_floats[u] += int64_t(double(b[u + 1] - b[u]) * share);
    const int64_t held = int64_t(double(b.back() - b.front()) * share);
    all += held;
    if (share < 1) experts += held;
    shard_floats += held / flat_size(mesh, axes.groups[size_t(g)].shard);
  }
  const int64_t N = layout.local_batch * (step.seq_len / cp);
  const std::vector<LinearGemm::WeightCopies> unit_copies =
      weight_copies(m, N, false, work.group_share);

  const bool selective = step.activation_checkpointing == "selective";
  m.set_selective_recompute(selective);
  const int64_t T = step.seq_len / cp;
  const Program& train = work.program;

  // ZeRO-2/3 reduce-scatter each unit's gradients as backward finishes it and free them, unless
  // accumulation (several micro-batches, or a pipeline's) keeps the whole buffer summing.
  const bool accumulating = step.grad_accum_steps > 1 || pp > 1;
  const bool offload_params = parallel.offload_params == "file";
  const Zero3Peak gathered = zero == 3 ? zero3_peak(train, unit_floats, unit_copies) : Zero3Peak{};
  const ModelState state =
      resident_state(parallel, optimizer_offload, double(all), double(shard_floats),
                     double(gathered.values), double(accumulating ? all : largest(unit_floats, 3)));
  plan.parameters = int64_t(state.values);
  plan.gradients = int64_t(state.gradients);
  plan.optimizer = int64_t(state.optimizer);
  // Without ZeRO-3 every unit keeps its copies from step to step.
  plan.weight_copies = gathered.copies;
  if (zero < 3)
    for (const LinearGemm::WeightCopies& c : unit_copies) plan.weight_copies += c.total();
  if (offload_params && zero == 3)
    plan.notes.push_back("the parameter shards live in offload files");
  if (optimizer_offload == "file") plan.notes.push_back("AdamW's moments live in offload files");

  // The communication engine's scratch, as large as the step's largest reduction needs
  // (reduction_scratch_bytes): DataParallel's run on cleave's ring, DDP's in buckets of bucket_mb.
  const int64_t bucket = bucket_floats(parallel.bucket_mb);
  for (const auto& w : work.work)
    for (const CommCall& c : w->comms) {
      if (c.kind != Collective::all_reduce && c.kind != Collective::reduce_scatter) continue;
      const bool data_parallel = c.metered == CommAxis::dp;
      int64_t count = int64_t(c.bytes / 4);
      if (c.kind == Collective::reduce_scatter) count /= c.ranks;
      else if (data_parallel && c.axis == "dp") count = std::min(bucket, all);
      plan.comm_buffers = std::max(
          plan.comm_buffers,
          reduction_scratch_bytes(c.kind == Collective::reduce_scatter, count, CommType::f32,
                                  c.ranks, data_parallel ? CommAlgo::ours : CommAlgo::fastest));
    }

  plan.activations = predict_activation_memory(m, train, layout.local_batch, T, selective);
  plan.backward_scratch = m.backward_scratch_bytes(layout.local_batch, T);
  // The products run on the rank's one calling thread (oneDNN's threads keep no such buffers).
  plan.product_scratch = m.product_scratch_bytes(N).total();
  // The blocks share one scratch: the largest layer's exchange buffers.
  if (experts > 0) {
    int64_t ep_scratch = 0;
    for (const Moe* moe : m.moe_layers()) ep_scratch = std::max(ep_scratch, moe->ep_scratch_bytes(N));
    plan.backward_scratch += ep_scratch;
  }
  if (val_batches > 0) {
    const StageMap& stages = layout.check.stages;
    const Program val =
        lower_schedule(forward_only_schedule(stages, pp, val_batches), stages, pp_rank,
                       unit_layout(m), {zero == 3, false, store.n_groups(), {}});
    const ActivationMemory v = predict_activation_memory(m, val, layout.local_batch, T, selective);
    plan.activations.slots = std::max(plan.activations.slots, v.slots);
    plan.activations.saved = std::max(plan.activations.saved, v.saved);
  }
  return plan;
}

}  // namespace cleave
