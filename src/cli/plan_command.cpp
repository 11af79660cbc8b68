// `cleave plan CONFIG --world N [--set key=value ...]`: what each pipeline stage's ranks of the
// configured layout hold in memory and compute per step, and the bytes each mesh axis moves,
// predicted from the step programs the trainer would run (docs/planner.md). Runs on one rank, no
// MPI, and allocates nothing of the model's size.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/base/file.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/memory.h"
#include "cleave/plan/report.h"
#include "cleave/plan/axis_volume.h"
#include "cleave/train/config.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

double mib(int64_t bytes) { return double(bytes) / (1 << 20); }

}  // namespace

int plan(int argc, char** argv) {
  const Args a = Args::parse("plan", argc, argv, {"--world", "--json", "--report", "--ranks-per-host"});
  if (a.positional.size() != 1)
    throw Error("cleave plan: expected CONFIG.toml (usage: cleave plan CONFIG.toml --world N "
                "[--set key=value ...] [--ranks-per-host K] [--json OUT.json] [--report OUT.html])");
  if (!a.has("--world")) throw Error("cleave plan: --world N is required");
  const int world = int(a.integer("--world", 1, 1, INT32_MAX));
  const int per_host = int(a.integer("--ranks-per-host", world, 1, INT32_MAX));
  const Config cfg = load_config(a.positional[0], a.overrides);
  const TrainConfig& t = cfg.train;
  // The trainer's own check: a layout it would refuse is refused here with its message.
  const Layout layout = plan_layout(cfg.model, cfg.parallel, t, world);
  const Mesh& mesh = layout.mesh;
  const int pp = mesh.degree(Axis::pp), cp = mesh.degree(Axis::cp), tp = mesh.degree(Axis::tp);
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
  std::printf("\nmemory per rank (MiB; every rank of a stage holds as much):\n");
  std::printf("  %-5s %12s %10s %10s %10s %10s %12s %10s %10s\n", "stage", "parameters",
              "values", "gradients", "optimizer", "w. copies", "activations", "scratch", "total");
  nlohmann::json out = {{"world", world}, {"stages", nlohmann::json::array()}};
  PlanReport report;
  report.title = "cleave plan: " + a.positional[0] + " on " + std::to_string(world) + " ranks";
  report.mesh = &mesh;
  report.ranks_per_host = per_host;
  for (int r = 0; r < pp; ++r) {
    const MemoryPlan p =
        plan_memory(cfg.model, cfg.parallel, t, cfg.optim.offload, layout, r, val_batches);
    std::printf("  %-5d %12lld %10.1f %10.1f %10.1f %10.1f %12.1f %10.1f %10.1f\n", r,
                (long long)p.parameter_count, mib(p.parameters), mib(p.gradients),
                mib(p.optimizer), mib(p.weight_copies), mib(p.activations.total()),
                mib(p.backward_scratch), mib(p.total()));
    for (const std::string& note : p.notes) std::printf("        not counted: %s\n", note.c_str());
    report.stages.push_back(p);
    // The stage's FLOPs per step on one rank, as MFU counts them: 6 per matmul parameter and
    // token, and attention's 6 x layers x sequence x d_model per token (causal, halved).
    const std::vector<ModelChunk> chunks = stage_chunks(layout, r);
    const std::unique_ptr<Transformer> m =
        Transformer::planned(cfg.model, tp, cfg.parallel.sequence_parallel, chunks, t.dtype);
    int layers = 0;
    for (const ModelChunk& c : chunks) layers += c.end_layer - c.first_layer;
    const double tokens = double(layout.local_batch) * (t.seq_len / cp) * t.grad_accum_steps;
    const double flops = tokens * (6.0 * double(m->matmul_params()) +
                                   6.0 * layers * t.seq_len * double(cfg.model.d_model) / tp);
    out["stages"].push_back({{"pp_rank", r}, {"parameter_count", p.parameter_count},
                             {"values", p.parameters}, {"gradients", p.gradients},
                             {"optimizer", p.optimizer}, {"weight_copies", p.weight_copies},
                             {"activations", p.activations.total()},
                             {"backward_scratch", p.backward_scratch}, {"total", p.total()},
                             {"flops_per_step", flops}, {"not_counted", p.notes}});
    std::printf("        %.3g FLOPs per step on each of its ranks (%d layers)\n", flops, layers);
  }
  std::printf("\nbytes rank 0 sends per step on each mesh axis:\n");
  const std::vector<AxisVolume> volumes = axis_volumes(step_work(cfg.model, cfg.parallel, t, layout, 0));
  if (volumes.empty()) std::printf("  none: a single rank\n");
  out["axes"] = nlohmann::json::array();
  for (const AxisVolume& v : volumes) {
    std::printf("  %-13s %10.2f MiB  %s\n", v.axis.c_str(), v.bytes / (1 << 20), v.how.c_str());
    out["axes"].push_back({{"axis", v.axis}, {"bytes", v.bytes}, {"how", v.how}});
    report.axes.push_back({v.axis, v.bytes, v.how});
  }
  if (a.has("--report")) {
    report.timeline = simulated_trace(layout.schedule, layout.check);
    const std::string path = a.get("--report", "");
    write_file_atomic(path, plan_report_html(report), "plan report");
    std::printf("\nwrote %s\n", path.c_str());
  }
  if (a.has("--json")) write_file_atomic(a.get("--json", ""), out.dump(1) + "\n", "plan");
  return 0;
}

}  // namespace cleave::cli
