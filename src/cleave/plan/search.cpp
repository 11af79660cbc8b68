#include "cleave/plan/search.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/memory.h"

namespace cleave {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// A search's pipeline plans by (pp, micro-batches): the layouts that share them share the schedule,
// whose check is most of what validating a layout costs. Null: that schedule cannot run.
class PipelinePlans {
 public:
  PipelinePlans(const ModelConfig& model, const ParallelConfig& base)
      : model_(model), base_(base) {
    base_.pp_layers.clear();
  }
  const PipelinePlan* get(int pp, int microbatches) {
    auto [it, added] = plans_.try_emplace({pp, microbatches});
    if (added) {
      try {
        it->second = std::make_unique<PipelinePlan>(plan_pipeline(model_, base_, pp, microbatches));
      } catch (const Error&) {
      }
    }
    return it->second.get();
  }

 private:
  const ModelConfig& model_;
  ParallelConfig base_;
  std::map<std::pair<int, int>, std::unique_ptr<PipelinePlan>> plans_;
};

}  // namespace

std::string Candidate::label() const {
  const ParallelConfig& p = parallel;
  std::string out;
  auto axis = [&](const char* name, int degree) {
    if (degree > 1) out += std::string(out.empty() ? "" : " x ") + name + " " + std::to_string(degree);
  };
  axis("pp", p.pp);
  axis("dp_replicate", p.dp_replicate);
  axis("dp_shard", p.dp_shard);
  axis("cp", p.cp);
  axis("tp", p.tp);
  if (out.empty()) out = "1 rank";
  if (p.ep > 1) out += ", ep " + std::to_string(p.ep);
  out += ", ZeRO-" + std::to_string(p.zero_stage);
  if (p.sequence_parallel) out += ", SP";
  if (step.activation_checkpointing != "none") out += ", AC " + step.activation_checkpointing;
  out += ", " + std::to_string(step.grad_accum_steps) + " micro-batch" +
         (step.grad_accum_steps == 1 ? "" : "es");
  return out;
}

std::vector<Candidate> valid_layouts(const ModelConfig& model, const ParallelConfig& base,
                                     const StepOptions& base_step, int world) {
  const int64_t global = int64_t(base_step.micro_batch_size) * base_step.grad_accum_steps;
  PipelinePlans pipelines(model, base);
  std::vector<Candidate> out;
  for (int pp : divisors(world))
    for (int R : divisors(world / pp))
      for (int S : divisors(world / pp / R))
        for (int cp : divisors(world / pp / R / S)) {
          const int tp = world / pp / R / S / cp;
          const std::vector<int> eps =
              model.moe_experts > 0 ? divisors(S * cp) : std::vector<int>{1};
          for (int ep : eps)
            for (int zero = 0; zero <= 3; ++zero) {
              if (zero > 0 && S * cp == 1) continue;  // no shard axis: every stage is ZeRO-0
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                for (const char* ac : {"none", "selective", "full"})
                  for (int64_t accum = 1; accum <= global; accum *= 2) {
                    if (global % accum) continue;
                    const PipelinePlan* pipeline = pipelines.get(pp, int(accum));
                    if (!pipeline) continue;  // the schedule cannot run
                    Candidate c;
                    c.parallel = base;
                    c.parallel.pp = pp;
                    c.parallel.dp_replicate = R;
                    c.parallel.dp_shard = S;
                    c.parallel.cp = cp;
                    c.parallel.tp = tp;
                    c.parallel.ep = ep;
                    c.parallel.zero_stage = zero;
                    c.parallel.sequence_parallel = sp;
                    c.parallel.pp_layers.clear();
                    c.step = base_step;
                    c.step.activation_checkpointing = ac;
                    c.step.grad_accum_steps = int(accum);
                    c.step.micro_batch_size = int(global / accum);
                    try {
                      plan_mesh(model, c.parallel, c.step, world);
                    } catch (const Error&) {
                      continue;  // `cleave train` would refuse it
                    }
                    out.push_back(std::move(c));
                  }
              }
            }
        }
  return out;
}

std::vector<Ranked> search_layouts(const ModelConfig& model, const ParallelConfig& base,
                                   const StepOptions& base_step,
                                   const std::string& optimizer_offload, int world,
                                   const Cluster& cluster) {
  std::vector<Ranked> out;
  PipelinePlans pipelines(model, base);
  for (Candidate& c : valid_layouts(model, base, base_step, world)) {
    MeshPlan m = plan_mesh(model, c.parallel, c.step, world);
    const PipelinePlan& p = *pipelines.get(c.parallel.pp, c.step.grad_accum_steps);
    const Layout layout{std::move(m.mesh), m.local_batch, p.schedule, p.check, p.stage_layers,
                        m.cp_mode, m.cp_ulysses};
    Ranked r;
    std::vector<StepWork> work;
    for (int s = 0; s < layout.mesh.degree(Axis::pp); ++s) {
      work.push_back(step_work(model, c.parallel, c.step, layout, s));
      const MemoryPlan m =
          plan_memory(model, c.parallel, c.step, optimizer_offload, layout, work.back(), 0);
      r.peak_bytes = std::max(r.peak_bytes, m.total());
    }
    r.fits = double(r.peak_bytes) <= cluster.memory_gib * double(1 << 30);
    r.prediction = predict_step(work, layout, cluster, model, c.step);
    r.candidate = std::move(c);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const Ranked& a, const Ranked& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.prediction.tokens_per_second > b.prediction.tokens_per_second;
    return a.peak_bytes < b.peak_bytes;
  });
  return out;
}

std::string explain_winner(const Ranked& winner, const Ranked& runner_up) {
  // The slowest stage of each, its time by part.
  auto parts = [](const Ranked& r) {
    const RankTime* slowest = &r.prediction.ranks[0];
    for (const RankTime& t : r.prediction.ranks)
      if (t.end > slowest->end) slowest = &t;
    std::vector<std::pair<std::string, double>> p = {
        {"the products", slowest->gemm},
        {"attention", slowest->attention},
        {"element-wise work", slowest->elementwise},
        {"waiting for other pipeline stages", slowest->pipeline_wait}};
    for (const auto& [axis, seconds] : slowest->comm) p.push_back({axis + " collectives", seconds});
    return p;
  };
  const auto w = parts(winner), u = parts(runner_up);
  std::string part = "the products";
  double most = 0;
  auto seconds_of = [](const std::vector<std::pair<std::string, double>>& list,
                       const std::string& name) {
    for (const auto& [n, s] : list)
      if (n == name) return s;
    return 0.0;
  };
  for (const auto& list : {w, u})
    for (const auto& [name, seconds] : list) {
      const double d = seconds_of(u, name) - seconds_of(w, name);
      if (std::abs(d) > std::abs(most)) most = d, part = name;
    }
  const double d = std::abs(most);
  char amount[64];
  if (d >= 1e-3)
    std::snprintf(amount, sizeof amount, "%.1f ms", 1e3 * d);
  else
    std::snprintf(amount, sizeof amount, "%.1f us", 1e6 * d);
  char text[768];
  std::snprintf(text, sizeof text,
                "%s predicts %.0f tokens/s against %.0f for %s; the largest difference between "
                "their slowest stages is %s: %s per step %s.",
                winner.candidate.label().c_str(), winner.prediction.tokens_per_second,
                runner_up.prediction.tokens_per_second, runner_up.candidate.label().c_str(),
                part.c_str(), amount,
                most >= 0 ? "more in the runner-up" : "less in the runner-up, which loses elsewhere");
  return text;
}

}  // namespace cleave
