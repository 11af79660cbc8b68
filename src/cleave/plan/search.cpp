#include "cleave/plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include <omp.h>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/layout_bounds.h"
#include "cleave/plan/memory.h"

namespace cleave {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// n layers over `chunks` pipeline chunks as evenly as they go, the chunks at the ends (which also
// hold the embedding and the head) taking fewer first, as Llama 3's 126 layers ran on 16 x 2
// chunks: 3, then 4 on each of 30, then 3.
std::vector<int> balanced_layers(int n, int chunks) {
  std::vector<int> out(size_t(chunks), n / chunks + 1);
  for (int i = 0; i < chunks - n % chunks; ++i)
    --out[size_t(i % 2 == 0 ? i / 2 : chunks - 1 - i / 2)];
  return out;
}

// A search's pipeline plans by (pp, micro-batches): the layouts that share them share the schedule,
// whose check is most of what validating a layout costs. The layers split as the config gives for
// its own pp, else evenly, else as balanced_layers. Null: that schedule cannot run.
class PipelinePlans {
 public:
  PipelinePlans(const ModelConfig& model, const ParallelConfig& base)
      : model_(model), base_(base) {}
  const PipelinePlan* get(int pp, int microbatches) {
    auto [it, added] = plans_.try_emplace({pp, microbatches});
    if (added) {
      ParallelConfig p = base_;
      p.pp = pp;
      if (pp != base_.pp) p.pp_layers.clear();
      try {
        try {
          it->second = std::make_unique<PipelinePlan>(plan_pipeline(model_, p, pp, microbatches));
        } catch (const Error&) {
          if (!p.pp_layers.empty()) throw;
          const int chunks = pipeline_schedule(p, pp, microbatches).n_stages;
          if (chunks > model_.n_layers) throw;
          p.pp_layers = balanced_layers(model_.n_layers, chunks);
          it->second = std::make_unique<PipelinePlan>(plan_pipeline(model_, p, pp, microbatches));
        }
      } catch (const Error&) {
      }
    }
    return it->second.get();
  }

 private:
  const ModelConfig& model_;
  const ParallelConfig& base_;
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
  if (!p.pp_layers.empty()) {
    // Runs of equal counts: "3, 4 x 30, 3".
    out += " (layers ";
    for (size_t i = 0; i < p.pp_layers.size();) {
      size_t j = i;
      while (j < p.pp_layers.size() && p.pp_layers[j] == p.pp_layers[i]) ++j;
      out += (i ? ", " : "") + std::to_string(p.pp_layers[i]) +
             (j - i > 1 ? " x " + std::to_string(j - i) : "");
      i = j;
    }
    out += ")";
  }
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

namespace {

// valid_layouts' with the search's pipeline plans, which it goes on to use.
std::vector<Candidate> valid_layouts_with(const ModelConfig& model, const ParallelConfig& base,
                                          const StepOptions& base_step, int world,
                                          PipelinePlans& pipelines) {
  const int64_t global = int64_t(base_step.micro_batch_size) * base_step.grad_accum_steps;
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
              if (zero > 0 && S * cp == 1) continue;  // no shard axis: ZeRO would shard nothing
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
                    // Explicit where they are uneven, so that `cleave train` takes them too.
                    const std::vector<int>& layers = pipeline->stage_layers;
                    c.parallel.pp_layers.clear();
                    if (std::adjacent_find(layers.begin(), layers.end(), std::not_equal_to<>()) !=
                        layers.end())
                      c.parallel.pp_layers = layers;
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

}  // namespace

std::vector<Candidate> valid_layouts(const ModelConfig& model, const ParallelConfig& base,
                                     const StepOptions& base_step, int world) {
  PipelinePlans pipelines(model, base);
  return valid_layouts_with(model, base, base_step, world, pipelines);
}

namespace {

// cost_layout's on the candidate's layout, planning pp rank 0 first and the last second (which hold the most activations
// and the head), and stopping at the first whose memory is above `stop_above` bytes: the layout
// does not fit, and peak_bytes is that rank's.
Ranked cost_layout_until(const ModelConfig& model, const Candidate& c, const Layout& layout,
                         const std::string& optimizer_offload, const Cluster& cluster,
                         double stop_above) {
  const int pp = layout.mesh.degree(Axis::pp);
  Ranked r;
  r.candidate = c;
  std::vector<StepWork> work(static_cast<size_t>(pp));
  std::vector<int> order = {0};
  if (pp > 1) order.push_back(pp - 1);
  for (int s = 1; s + 1 < pp; ++s) order.push_back(s);
  for (int s : order) {
    work[size_t(s)] = step_work(model, c.parallel, c.step, layout, s);
    const MemoryPlan m =
        plan_memory(model, c.parallel, c.step, optimizer_offload, layout, work[size_t(s)], 0);
    r.peak_bytes = std::max(r.peak_bytes, m.total());
    if (double(r.peak_bytes) > stop_above) return r;
  }
  r.fits = double(r.peak_bytes) <= cluster.memory_gib * double(1 << 30);
  if (r.fits) r.prediction = predict_step(work, layout, cluster, model, c.step);
  return r;
}

}  // namespace

Ranked cost_layout(const ModelConfig& model, const Candidate& c,
                   const std::string& optimizer_offload, int world, const Cluster& cluster) {
  return cost_layout_until(model, c, plan_layout(model, c.parallel, c.step, world),
                           optimizer_offload, cluster, std::numeric_limits<double>::infinity());
}

SearchResult search_layouts(const ModelConfig& model, const ParallelConfig& base,
                            const StepOptions& base_step, const std::string& optimizer_offload,
                            int world, const Cluster& cluster, int top) {
  CLEAVE_CHECK(top >= 1, "search_layouts: top = " + std::to_string(top));
  SearchResult out;
  PipelinePlans pipelines(model, base);
  std::vector<Candidate> all = valid_layouts_with(model, base, base_step, world, pipelines);
  out.valid = all.size();
  std::vector<const PipelinePlan*> pipeline(all.size());
  for (size_t i = 0; i < all.size(); ++i)
    pipeline[i] = pipelines.get(all[i].parallel.pp, all[i].step.grad_accum_steps);
  auto layout_at = [&](size_t i) {
    return layout_of(plan_mesh(model, all[i].parallel, all[i].step, world), *pipeline[i]);
  };
  LayoutBounds bounds(model, optimizer_offload, world, cluster);
  const double capacity = cluster.memory_gib * double(1 << 30);
  // A bound and a cost are sums of the same terms in other orders: allow for their rounding.
  constexpr double kSlack = 1e-9;
  struct Bound {
    double seconds = 0, bytes = 0;
  };
  std::vector<Bound> bound(all.size());
  // The layouts are independent: bound and cost them on every thread, each error kept for the
  // caller (an exception may not leave a parallel region).
  std::vector<std::exception_ptr> failed(all.size());
  auto rethrow = [&] {
    for (const std::exception_ptr& e : failed)
      if (e) std::rethrow_exception(e);
  };
#pragma omp parallel for schedule(dynamic, 64)
  for (size_t i = 0; i < all.size(); ++i) {
    try {
      const Candidate& c = all[i];
      bound[i].bytes = bounds.memory_bytes(c.parallel, c.step, *pipeline[i]) * (1 - kSlack);
      if (bound[i].bytes <= capacity)
        bound[i].seconds = bounds.step_seconds(c.parallel, c.step, *pipeline[i]) * (1 - kSlack);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  }
  rethrow();
  std::vector<size_t> order;
  for (size_t i = 0; i < all.size(); ++i) {
    if (bound[i].bytes > capacity)
      ++out.beyond_memory;
    else
      order.push_back(i);
  }
  auto check_bounds = [&](size_t i, const Ranked& r) {
    CLEAVE_CHECK(double(r.peak_bytes) >= bound[i].bytes,
                 "search: " + r.candidate.label() + " plans " + std::to_string(r.peak_bytes) +
                     " bytes, below its bound of " + std::to_string(bound[i].bytes));
    CLEAVE_CHECK(!r.fits || r.prediction.step_seconds >= bound[i].seconds,
                 "search: " + r.candidate.label() + " predicts a step of " +
                     std::to_string(r.prediction.step_seconds) + " s, below its bound of " +
                     std::to_string(bound[i].seconds) + " s");
  };
  // The best first; among equals, the one listed first.
  std::vector<std::pair<size_t, Ranked>> best;
  auto better = [](const std::pair<size_t, Ranked>& a, const std::pair<size_t, Ranked>& b) {
    if (a.second.prediction.tokens_per_second != b.second.prediction.tokens_per_second)
      return a.second.prediction.tokens_per_second > b.second.prediction.tokens_per_second;
    return a.first < b.first;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bound[a].seconds < bound[b].seconds; });
  // In the order of the time bound, a thread's worth at a time, until the bound passes the
  // top-th best found: no layout after it can enter the top.
  const size_t threads = size_t(std::max(1, omp_get_max_threads()));
  for (size_t n = 0; n < order.size();) {
    std::vector<size_t> batch;
    while (n < order.size() && batch.size() < threads &&
           !(int(best.size()) == top &&
             bound[order[n]].seconds > best.back().second.prediction.step_seconds))
      batch.push_back(order[n++]);
    if (batch.empty()) {
      out.beyond_time = order.size() - n;
      break;
    }
    std::vector<Ranked> costed(batch.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t b = 0; b < batch.size(); ++b) {
      try {
        costed[b] = cost_layout_until(model, all[batch[b]], layout_at(batch[b]),
                                      optimizer_offload, cluster, capacity);
      } catch (...) {
        failed[batch[b]] = std::current_exception();
      }
    }
    rethrow();
    for (size_t b = 0; b < batch.size(); ++b) {
      ++out.planned;
      check_bounds(batch[b], costed[b]);
      if (!costed[b].fits) continue;
      ++out.fitting;
      std::pair<size_t, Ranked> entry{batch[b], std::move(costed[b])};
      best.insert(std::upper_bound(best.begin(), best.end(), entry, better), std::move(entry));
      if (int(best.size()) > top) best.pop_back();
    }
  }
  for (auto& [i, r] : best) out.best.push_back(std::move(r));
  if (!out.best.empty()) return out;
  // None fits: the least memory, planning in the order of the memory bound until it passes
  // the least found.
  std::vector<size_t> by_memory(all.size());
  for (size_t i = 0; i < all.size(); ++i) by_memory[i] = i;
  std::stable_sort(by_memory.begin(), by_memory.end(),
                   [&](size_t a, size_t b) { return bound[a].bytes < bound[b].bytes; });
  for (size_t i : by_memory) {
    if (out.smallest && bound[i].bytes > double(out.smallest->peak_bytes)) break;
    Ranked r = cost_layout_until(model, all[i], layout_at(i), optimizer_offload, cluster,
                                 std::numeric_limits<double>::infinity());
    check_bounds(i, r);
    if (!out.smallest || r.peak_bytes < out.smallest->peak_bytes) out.smallest = std::move(r);
  }
  return out;
}

std::string explain_winner(const Ranked& winner, const Ranked& runner_up) {
  const double w_rate = winner.prediction.tokens_per_second,
               u_rate = runner_up.prediction.tokens_per_second;
  if (std::abs(w_rate - u_rate) <= 1e-9 * w_rate)
    return winner.candidate.label() + " and " + runner_up.candidate.label() + " tie at " +
           std::to_string(std::llround(w_rate)) +
           " tokens/s (their slowest stages end together); ties keep the order in which the "
           "search lists layouts.";
  // The slowest stage of each, its time by part.
  auto parts = [](const Ranked& r) {
    const RankTime* slowest = &r.prediction.ranks[0];
    for (const RankTime& t : r.prediction.ranks)
      if (t.end > slowest->end) slowest = &t;
    std::vector<std::pair<std::string, double>> p = {
        {"the products", slowest->gemm},
        {"attention", slowest->attention},
        {"element-wise work", slowest->elementwise},
        {"waiting for the slowest rank", slowest->imbalance},
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
