// `cleave plan CONFIG --world N [--set key=value ...]`: what each pipeline stage's ranks of the
// configured layout hold in memory and compute per step, and the bytes each mesh axis moves,
// predicted from the step programs the trainer would run (docs/planner.md). Runs on one rank, no
// MPI, and allocates nothing of the model's size.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/base/file.h"
#include "cleave/base/toml_keys.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/cluster.h"
#include "cleave/plan/memory.h"
#include "cleave/plan/report.h"
#include "cleave/plan/routing.h"
#include "cleave/plan/search.h"
#include "cleave/plan/step_time.h"
#include "cleave/plan/axis_volume.h"
#include "cleave/train/config.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

double mib(int64_t bytes) { return double(bytes) / (1 << 20); }

// The step's predicted time on the cluster: per pipeline stage where its time goes, then the
// step, tokens/s and MFU (docs/planner.md, Step time).
StepPrediction print_step_time(const Cluster& cluster, const Layout& layout,
                               const std::vector<StepWork>& work, const Config& cfg,
                               nlohmann::json& out) {
  const TrainConfig& t = cfg.train;
  const StepPrediction p = predict_step(work, layout, cluster, cfg.model, t);
  std::printf("\npredicted step on %s (%d devices per host; ms per step, each rank of a "
              "stage alike):\n",
              cluster.name.c_str(), cluster.devices_per_host);
  if (compute_imbalance_on(cluster, layout.mesh.world()) > 1)
    std::printf("  (compute x %s: the slowest of the ranks that wait for each other, "
                "cluster.compute_imbalance; its share is the imbalance column)\n",
                show_real(cluster.compute_imbalance).c_str());
  bool ep_wait = false;
  for (const StepWork& w : work)
    for (const auto& iw : w.work) ep_wait = ep_wait || !iw->waited.empty();
  if (ep_wait)
    std::printf("  (the imbalance column also holds the busiest ep rank's expert rows beyond this "
                "rank's, by the routing: every rank waits for them at the all-to-all after the "
                "experts)\n");
  std::printf("  %-5s %10s %10s %12s %10s %14s %10s  %s\n", "stage", "products", "attention",
              "elementwise", "imbalance", "pipeline wait", "end", "exposed communication");
  out["step"] = {{"cluster", cluster.name}, {"stages", nlohmann::json::array()}};
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    const RankTime& rt = p.ranks[r];
    std::string comm;
    nlohmann::json per_axis = nlohmann::json::object();
    for (const auto& [axis, seconds] : rt.comm) {
      char part[96];
      std::snprintf(part, sizeof part, "%s%s %.1f", comm.empty() ? "" : ", ", axis.c_str(),
                    1e3 * seconds);
      comm += part;
      per_axis[axis] = seconds;
    }
    std::printf("  %-5zu %10.1f %10.1f %12.1f %10.1f %14.1f %10.1f  %s\n", r, 1e3 * rt.gemm,
                1e3 * rt.attention, 1e3 * rt.elementwise, 1e3 * rt.imbalance,
                1e3 * rt.pipeline_wait, 1e3 * rt.end,
                comm.empty() ? "none" : comm.c_str());
    out["step"]["stages"].push_back({{"pp_rank", r}, {"products_s", rt.gemm},
                                     {"attention_s", rt.attention},
                                     {"elementwise_s", rt.elementwise},
                                     {"imbalance_s", rt.imbalance},
                                     {"pipeline_wait_s", rt.pipeline_wait}, {"end_s", rt.end},
                                     {"exposed_comm_s", per_axis}});
  }
  std::printf("step %.1f ms, %.0f tokens/s", 1e3 * p.step_seconds, p.tokens_per_second);
  if (p.peak_gflops > 0)
    std::printf(", MFU %.1f%% of the %s GEMM peak %.0f GF/s per device\n", 100 * p.mfu,
                precision_name(product_dtype(t.dtype)), p.peak_gflops);
  else
    std::printf(", MFU unknown (the cluster gives no %s peak)\n",
                precision_name(product_dtype(t.dtype)));
  out["step"]["step_s"] = p.step_seconds;
  out["step"]["tokens_per_s"] = p.tokens_per_second;
  out["step"]["mfu"] = p.peak_gflops > 0 ? nlohmann::json(p.mfu) : nlohmann::json(nullptr);
  return p;
}

// --search: the best `top` valid layouts that fit, how many the bounds spared costing, and why
// the winner wins; the best, for the report.
std::vector<RankedLayout> print_search(const Cluster& cluster, const Config& cfg, int world,
                                       int top, nlohmann::json& out) {
  // The runner-up explains the winner.
  const SearchResult found = search_layouts(cfg.model, cfg.parallel, cfg.train, cfg.optim.offload,
                                            world, cluster, std::max(top, 2));
  std::printf("\nsearch on %s: %zu valid layouts of %d devices; %zu need more than %.1f GiB per "
              "device by a bound on their memory, %zu cannot beat the best %d by a bound on their "
              "step time, %zu planned in full (%zu fit); the best %d by predicted tokens/s:\n",
              cluster.name.c_str(), found.valid, world, found.beyond_memory, cluster.memory_gib,
              found.beyond_time, std::max(top, 2), found.planned, found.fitting,
              std::min(top, int(found.best.size())));
  std::printf("  %4s %10s %10s %7s %9s  %s\n", "rank", "tokens/s", "step ms", "MFU", "GiB/rank",
              "layout");
  out["search"] = {{"valid", found.valid},
                   {"beyond_memory", found.beyond_memory},
                   {"beyond_time", found.beyond_time},
                   {"planned", found.planned},
                   {"fitting", found.fitting},
                   {"best", nlohmann::json::array()}};
  std::vector<RankedLayout> best;
  for (int i = 0; i < int(found.best.size()) && i < top; ++i) {
    const Ranked& r = found.best[size_t(i)];
    out["search"]["best"].push_back({{"layout", r.candidate.label()},
                                     {"peak_bytes", r.peak_bytes},
                                     {"tokens_per_s", r.prediction.tokens_per_second},
                                     {"step_s", r.prediction.step_seconds}});
    best.push_back({r.candidate.label(), r.prediction.tokens_per_second,
                    r.prediction.step_seconds, r.prediction.mfu, r.peak_bytes});
    std::printf("  %4d %10.0f %10.1f %6.1f%% %9.2f  %s\n", i + 1,
                r.prediction.tokens_per_second, 1e3 * r.prediction.step_seconds,
                100 * r.prediction.mfu, double(r.peak_bytes) / (1 << 30),
                r.candidate.label().c_str());
  }
  if (found.best.size() >= 2)
    std::printf("%s\n", explain_winner(found.best[0], found.best[1]).c_str());
  if (found.smallest)
    std::printf("no layout fits: the smallest, %s, needs %.2f GiB per device\n",
                found.smallest->candidate.label().c_str(),
                double(found.smallest->peak_bytes) / (1 << 30));
  return best;
}

}  // namespace

int plan(int argc, char** argv) {
  const Args a = Args::parse("plan", argc, argv,
                             {"--world", "--json", "--report", "--ranks-per-host", "--cluster",
                              "--top", "--routing"},
                             {"--search"});
  if (a.positional.size() != 1)
    throw Error("cleave plan: expected CONFIG.toml (usage: cleave plan CONFIG.toml --world N "
                "[--set key=value ...] [--cluster CLUSTER.toml [--search [--top K]]] [--ranks-per-host K] "
                "[--routing RUN_DIR] [--json OUT.json] [--report OUT.html])");
  if (a.has("--search") && !a.has("--cluster"))
    throw Error("cleave plan: --search ranks layouts by predicted time and needs --cluster "
                "CLUSTER.toml");
  if (!a.has("--world")) throw Error("cleave plan: --world N is required");
  const int world = int(a.integer("--world", 1, 1, INT32_MAX));
  const int per_host = int(a.integer("--ranks-per-host", world, 1, INT32_MAX));
  const Config cfg = load_config(a.positional[0], a.overrides);
  const TrainConfig& t = cfg.train;
  // The trainer's own check: a layout it would refuse is refused here with its message.
  const Layout layout = plan_layout(cfg.model, cfg.parallel, t, world);
  if (a.has("--routing") && cfg.model.moe_experts == 0)
    throw Error("cleave plan: --routing gives a MoE model's routing; model.moe_experts is 0");
  std::optional<ExpertRouting> routing;
  if (a.has("--routing")) routing = read_routing(a.get("--routing", ""), cfg.model);
  const Mesh& mesh = layout.mesh;
  const int pp = mesh.degree(Axis::pp), cp = mesh.degree(Axis::cp);
  const int val_batches = t.val_interval > 0 ? int(t.val_batches) : 0;
  std::string axes;
  for (Axis axis : kMeshAxes)
    axes += std::string(axes.empty() ? "" : " x ") + axis_name(axis) + " " +
            std::to_string(mesh.degree(axis));
  std::printf("plan of %s on %d ranks (%s, ZeRO-%d): %s, micro-batch %lld x %d tokens per rank, "
              "%d micro-batches per step\n",
              a.positional[0].c_str(), world, axes.c_str(), cfg.parallel.zero_stage,
              precision_name(t.dtype), (long long)layout.local_batch, t.seq_len / cp,
              t.grad_accum_steps);
  // With routing, ep ranks hold different experts' rows: the table is ep rank 0's.
  std::printf("\nmemory per rank (MiB; %s):\n",
              routing && cfg.parallel.ep > 1 ? "ep rank 0 of each stage; every ep rank below"
                                             : "every rank of a stage holds as much");
  std::printf("  %-5s %12s %10s %10s %10s %10s %12s %10s %8s %10s\n", "stage", "parameters",
              "values", "gradients", "optimizer", "w. copies", "activations", "scratch", "comm",
              "total");
  nlohmann::json out = {{"world", world}, {"stages", nlohmann::json::array()}};
  std::vector<StepWork> work;  // per pp rank
  PlanReport report;
  report.title = "cleave plan: " + a.positional[0] + " on " + std::to_string(world) + " ranks";
  report.mesh = &mesh;
  report.ranks_per_host = per_host;
  for (int r = 0; r < pp; ++r) {
    work.push_back(step_work(cfg.model, cfg.parallel, t, layout, r, routing ? &*routing : nullptr));
    const MemoryPlan p =
        plan_memory(cfg.model, cfg.parallel, t, cfg.optim.offload, layout, work.back(), val_batches);
    std::printf("  %-5d %12lld %10.1f %10.1f %10.1f %10.1f %12.1f %10.1f %8.1f %10.1f\n", r,
                (long long)p.parameter_count, mib(p.parameters), mib(p.gradients),
                mib(p.optimizer), mib(p.weight_copies), mib(p.activations.total()),
                mib(p.backward_scratch + p.product_scratch), mib(p.comm_buffers), mib(p.total()));
    for (const std::string& note : p.notes) std::printf("        not counted: %s\n", note.c_str());
    report.stages.push_back(p);
    out["stages"].push_back({{"pp_rank", r}, {"parameter_count", p.parameter_count},
                             {"values", p.parameters}, {"gradients", p.gradients},
                             {"optimizer", p.optimizer}, {"weight_copies", p.weight_copies},
                             {"activations", p.activations.total()},
                             {"backward_scratch", p.backward_scratch},
                             {"product_scratch", p.product_scratch},
                             {"comm_buffers", p.comm_buffers}, {"total", p.total()},
                             {"flops_per_step", work.back().model_flops},
                             {"not_counted", p.notes}});
    std::printf("        %.3g FLOPs per step on each of its ranks (products and attention, "
                "recomputation not counted)\n",
                work.back().model_flops);
  }
  if (routing) {
    std::printf("\nrouting: the mean of %s's %lld steps (ep rank i holds the i-th 1 / ep of the "
                "experts; every rank taken to route as the whole batch does)\n",
                routing->source.c_str(), (long long)routing->steps);
    // Routing makes the ep ranks differ: each one's memory and ep bytes.
    out["ep_ranks"] = nlohmann::json::array();
    for (int r = 0; r < pp && cfg.parallel.ep > 1; ++r)
      for (int e = 0; e < cfg.parallel.ep; ++e) {
        const StepWork w = step_work(cfg.model, cfg.parallel, t, layout, r, &*routing, e);
        const MemoryPlan p =
            plan_memory(cfg.model, cfg.parallel, t, cfg.optim.offload, layout, w, val_batches);
        double ep_bytes = 0;
        for (const AxisVolume& v : axis_volumes(w)) ep_bytes += v.axis == "ep" ? v.bytes : 0;
        std::printf("  stage %d, ep rank %d: %.1f MiB (activations %.1f, scratch %.1f), ep sends "
                    "%.2f MiB per step\n",
                    r, e, mib(p.total()), mib(p.activations.total()), mib(p.backward_scratch),
                    ep_bytes / (1 << 20));
        out["ep_ranks"].push_back({{"pp_rank", r}, {"ep_rank", e}, {"total", p.total()},
                                   {"activations", p.activations.total()},
                                   {"backward_scratch", p.backward_scratch},
                                   {"ep_bytes", ep_bytes}});
      }
  }
  std::printf("\nbytes rank 0 sends per step on each mesh axis:\n");
  const std::vector<AxisVolume> volumes = axis_volumes(work[0]);
  if (volumes.empty()) std::printf("  none: a single rank\n");
  out["axes"] = nlohmann::json::array();
  for (const AxisVolume& v : volumes) {
    std::printf("  %-13s %10.2f MiB  %s\n", v.axis.c_str(), v.bytes / (1 << 20), v.how.c_str());
    out["axes"].push_back({{"axis", v.axis}, {"bytes", v.bytes}, {"how", v.how}});
    report.axes.push_back({v.axis, v.bytes, v.how});
  }
  // ep's bytes for balanced routing beside the measured routing's.
  if (routing)
    for (const AxisVolume& v : axis_volumes(step_work(cfg.model, cfg.parallel, t, layout, 0)))
      if (v.axis == "ep") {
        std::printf("  %-13s %10.2f MiB  for balanced routing\n", "ep", v.bytes / (1 << 20));
        out["ep_bytes_balanced"] = v.bytes;
      }
  if (a.has("--cluster")) {
    const Cluster cluster = read_cluster(a.get("--cluster", ""));
    const StepPrediction p = print_step_time(cluster, layout, work, cfg, out);
    for (size_t r = 0; r < p.ranks.size(); ++r)
      for (const RankTime::Span& s : p.ranks[r].spans)
        report.timeline.push_back(
            {int(r), s.action, 1e6 * s.start, 1e6 * (s.end - s.start), -1, ""});
    report.timeline_cluster = cluster.name;
    report.capacity_bytes = int64_t(cluster.memory_gib * double(1 << 30));
    if (a.has("--search"))
      report.ranked =
          print_search(cluster, cfg, world, int(a.integer("--top", 10, 1, INT32_MAX)), out);
  } else {
    report.timeline = simulated_trace(layout.schedule, layout.check);
  }
  if (a.has("--report")) {
    const std::string path = a.get("--report", "");
    write_file_atomic(path, plan_report_html(report), "plan report");
    std::printf("\nwrote %s\n", path.c_str());
  }
  if (a.has("--json")) write_file_atomic(a.get("--json", ""), out.dump(1) + "\n", "plan");
  return 0;
}

}  // namespace cleave::cli
