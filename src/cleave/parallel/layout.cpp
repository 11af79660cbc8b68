#include "cleave/parallel/layout.h"

#include <utility>

#include "cleave/base/check.h"
#include "cleave/model/tp_share.h"
#include "cleave/parallel/step_executor.h"

namespace cleave {

namespace {

// The cp mode and the size of its Ulysses groups, or an error naming the keys and numbers.
std::pair<CpMode, int> plan_context(const ModelConfig& model, const ParallelConfig& p,
                                    const StepOptions& step, int cp, int tp) {
  const CpMode mode = parse_cp_mode(p.cp_mode);
  if (p.cp_ulysses != 0 && mode != CpMode::hybrid)
    throw Error("parallel.cp_ulysses = " + std::to_string(p.cp_ulysses) +
                " is for parallel.cp_mode = \"hybrid\" only (the mode is \"" + p.cp_mode + "\")");
  if (cp == 1) return {mode, 1};
  const int64_t seq = step.seq_len;
  if (seq % (2 * cp) != 0)
    throw Error("train.seq_len = " + std::to_string(seq) + " cannot be cut into 2 x parallel.cp = " +
                std::to_string(2 * cp) + " equal chunks (the zigzag split of context parallelism)");
  int U = 1;
  if (mode == CpMode::ulysses) U = cp;
  if (mode == CpMode::hybrid) {
    U = p.cp_ulysses;
    if (U < 2 || U >= cp || cp % U != 0)
      throw Error("parallel.cp_mode = \"hybrid\" needs parallel.cp_ulysses to divide parallel.cp = " +
                  std::to_string(cp) + " and lie between 2 and " + std::to_string(cp / 2) +
                  " (Ulysses groups inside a ring of at least two), not " + std::to_string(U));
  }
  if (U > 1) {
    const TpShare share = tp_share(model, tp, 0);
    const std::string what = "parallel.cp_mode = \"" + p.cp_mode + "\" with " + std::to_string(U) +
                             " Ulysses ranks: ";
    if (share.heads % U != 0)
      throw Error(what + "model.n_heads = " + std::to_string(model.n_heads) + " (" +
                  std::to_string(share.heads) + " per tp rank at parallel.tp = " +
                  std::to_string(tp) + ") do not divide by " + std::to_string(U));
    if (share.kv_heads % U != 0 && U % share.kv_heads != 0)
      throw Error(what + "model.n_kv_heads = " + std::to_string(model.n_kv_heads) + " (" +
                  std::to_string(share.kv_heads) + " per tp rank at parallel.tp = " +
                  std::to_string(tp) + ") neither divide by " + std::to_string(U) +
                  " nor divide it (to be replicated)");
  }
  return {mode, U};
}

}  // namespace

PipelinePlan plan_pipeline(const ModelConfig& model, const ParallelConfig& p, int pp,
                           int microbatches) {
  PipelinePlan plan;
  plan.schedule = pipeline_schedule(p, pp, microbatches);
  plan.stage_layers = stage_layers(p, plan.schedule, model.n_layers);
  plan.check = check_schedule(plan.schedule);
  return plan;
}

MeshPlan plan_mesh(const ModelConfig& model, const ParallelConfig& p, const StepOptions& step,
                   int world) {
  const std::string& ac = step.activation_checkpointing;
  if (ac != "none" && ac != "full" && ac != "selective")
    throw Error("train.activation_checkpointing = \"" + ac +
                "\" is not a mode (none, full, selective)");
  MeshDegrees d;
  d.pp = p.pp;
  d.dp_replicate = p.dp_replicate;
  d.dp_shard = p.dp_shard;
  d.cp = p.cp;
  d.tp = p.tp;
  Mesh mesh(world, d);
  const int tp = mesh.degree(Axis::tp);
  const auto [cp_mode, cp_ulysses] = plan_context(model, p, step, mesh.degree(Axis::cp), tp);
  if (cp_mode == CpMode::hybrid && mesh.degree(Axis::cp) > 1)
    mesh.carve(kCpUlyssesAxis, cp_ulysses, {Axis::cp}, kCpRingAxis);
  if (p.ep > 1) {
    const int experts = model.moe_experts;
    const int data = mesh.degree(Axis::dp_shard) * mesh.degree(Axis::cp);
    if (experts == 0)
      throw Error("parallel.ep = " + std::to_string(p.ep) +
                  " needs a mixture-of-experts model (model.moe_experts is 0)");
    if (experts % p.ep != 0)
      throw Error("model.moe_experts = " + std::to_string(experts) +
                  " cannot be split over parallel.ep = " + std::to_string(p.ep) +
                  ": the experts must be divisible by ep");
    if (data % p.ep != 0)
      throw Error("parallel.ep = " + std::to_string(p.ep) + " does not divide dp_shard x cp = " +
                  std::to_string(mesh.degree(Axis::dp_shard)) + " x " +
                  std::to_string(mesh.degree(Axis::cp)) + " = " + std::to_string(data) +
                  ", which the expert ranks are carved out of");
    carve_ep(mesh, p.ep);
  }
  if (p.sequence_parallel && tp == 1)
    throw Error("parallel.sequence_parallel = true needs parallel.tp > 1: it splits the rows "
                "between the tensor-parallel linears over the tp ranks");
  if (tp > 1) {
    tp_share(model, tp, 0);  // heads, kv heads and hidden units split over tp
    const int64_t rows = (int64_t(model.vocab_size) + tp - 1) / tp;
    if (rows * (tp - 1) >= model.vocab_size)
      throw Error("model.vocab_size = " + std::to_string(model.vocab_size) +
                  " cannot be split over parallel.tp = " + std::to_string(tp) + ": with " +
                  std::to_string(rows) + " rows per rank the last rank would hold none");
  }
  const int dp = mesh.degree(Axis::dp_replicate) * mesh.degree(Axis::dp_shard);
  const int micro = step.micro_batch_size;
  if (micro % dp != 0)
    throw Error("train.micro_batch_size = " + std::to_string(micro) +
                " is not divisible by the data-parallel degree " + std::to_string(dp) +
                " (dp_replicate x dp_shard): every rank takes an equal slice of each micro-batch");
  const int64_t tokens = int64_t(micro / dp) * step.seq_len / mesh.degree(Axis::cp);
  if (p.sequence_parallel && tokens % tp != 0)
    throw Error("parallel.sequence_parallel: a rank's " + std::to_string(micro / dp) + " x " +
                std::to_string(step.seq_len / mesh.degree(Axis::cp)) + " = " +
                std::to_string(tokens) +
                " tokens per micro-batch cannot be split into parallel.tp = " +
                std::to_string(tp) + " equal parts");
  return MeshPlan{std::move(mesh), micro / dp, cp_mode, cp_ulysses};
}

Layout layout_of(MeshPlan m, const PipelinePlan& pipeline) {
  return Layout{std::move(m.mesh),   m.local_batch,         pipeline.schedule, pipeline.check,
                pipeline.stage_layers, m.cp_mode, m.cp_ulysses};
}

Layout plan_layout(const ModelConfig& model, const ParallelConfig& p, const StepOptions& step,
                   int world) {
  MeshPlan m = plan_mesh(model, p, step, world);
  const int pp = m.mesh.degree(Axis::pp);
  return layout_of(std::move(m), plan_pipeline(model, p, pp, step.grad_accum_steps));
}

ModelChunk stage_chunk(const std::vector<int>& stage_layers, int stage) {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += stage_layers[size_t(s)];
  const int last = int(stage_layers.size()) - 1;
  return {first, first + stage_layers[size_t(stage)], stage == 0, stage == last};
}

std::vector<ModelChunk> stage_chunks(const Layout& layout, int rank) {
  const StageMap& stages = layout.check.stages;
  std::vector<ModelChunk> chunks;
  for (int s = 0; s < int(layout.stage_layers.size()); ++s)
    if (stages.rank_of_stage[size_t(s)] == rank) chunks.push_back(stage_chunk(layout.stage_layers, s));
  return chunks;
}

Schedule pipeline_schedule(const ParallelConfig& p, int pp, int microbatches) {
  if (!p.pp_schedule_csv.empty()) {
    Schedule s = load_schedule_csv(p.pp_schedule_csv);
    if (s.pp != pp)
      throw Error("parallel.pp_schedule_csv = " + p.pp_schedule_csv + " has " +
                  std::to_string(s.pp) + " rows (ranks), parallel.pp is " + std::to_string(pp));
    if (s.microbatches != microbatches)
      throw Error("parallel.pp_schedule_csv = " + p.pp_schedule_csv + " runs " +
                  std::to_string(s.microbatches) + " micro-batches, train.grad_accum_steps is " +
                  std::to_string(microbatches));
    return s;
  }
  const bool two_chunks = p.pp_schedule == "interleaved" || p.pp_schedule == "zbv";
  const int virtual_chunks = p.pp_virtual > 0 ? p.pp_virtual : two_chunks ? 2 : 1;
  try {
    return generate_schedule(p.pp_schedule, pp, microbatches, virtual_chunks);
  } catch (const Error& e) {
    throw Error("parallel.pp_schedule = " + p.pp_schedule + " (parallel.pp " +
                std::to_string(pp) + ", train.grad_accum_steps " + std::to_string(microbatches) +
                " micro-batches, parallel.pp_virtual " + std::to_string(virtual_chunks) + "): " +
                e.what());
  }
}

std::vector<int> stage_layers(const ParallelConfig& p, const Schedule& s, int n_layers) {
  const int stages = s.n_stages;
  if (!p.pp_layers.empty()) {
    if (int(p.pp_layers.size()) != stages)
      throw Error("parallel.pp_layers lists " + std::to_string(p.pp_layers.size()) +
                  " stages; the schedule has " + std::to_string(stages) + " (pp x virtual chunks)");
    int sum = 0;
    for (size_t i = 0; i < p.pp_layers.size(); ++i) {
      if (p.pp_layers[i] < 1)
        throw Error("parallel.pp_layers[" + std::to_string(i) + "] = " +
                    std::to_string(p.pp_layers[i]) + ": every stage needs at least one layer");
      sum += p.pp_layers[i];
    }
    if (sum != n_layers)
      throw Error("parallel.pp_layers sums to " + std::to_string(sum) + " layers; model.n_layers is " +
                  std::to_string(n_layers));
    return p.pp_layers;
  }
  if (n_layers < stages)
    throw Error("model.n_layers = " + std::to_string(n_layers) + " cannot fill " +
                std::to_string(stages) + " pipeline stages (pp x virtual chunks): each needs a layer");
  if (stages > s.pp && n_layers % stages != 0)
    throw Error("model.n_layers = " + std::to_string(n_layers) + " does not divide among " +
                std::to_string(s.pp) + " stages x " + std::to_string(stages / s.pp) +
                " virtual chunks = " + std::to_string(stages) + " for parallel.pp_schedule = " +
                s.name + "; give parallel.pp_layers explicitly");
  std::vector<int> layers(size_t(stages), n_layers / stages);
  for (int i = 0; i < n_layers % stages; ++i) ++layers[size_t(i)];
  return layers;
}

Program training_program(const StepOptions& step, const ParallelConfig& parallel,
                         const Layout& layout, int rank, const Transformer& model) {
  std::vector<bool> checkpoint(size_t(model.n_units()), false);
  if (step.activation_checkpointing != "none")
    for (int u = 0; u < model.n_units(); ++u) {
      const Transformer::Unit& unit = model.units()[size_t(u)];
      checkpoint[size_t(u)] = unit.kind == Transformer::UnitKind::block &&
                              unit.layer % step.ac_every == 0;
    }
  return lower_schedule(layout.schedule, layout.check.stages, rank, unit_layout(model),
                        {parallel.zero_stage == 3, true, model.params().n_groups(), checkpoint,
                         model.config().moe_experts > 0,
                         step.dtype == Precision::fp8 && step.fp8.per_tensor()});
}

}  // namespace cleave
