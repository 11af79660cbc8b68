// `cleave mesh [CONFIG] --world N [--set key=value ...] [--ranks-per-host K]`: prints every group
// of every mesh axis and whether it stays within one host; with a training config, also the
// bytes each axis moves per step. Runs on one rank, no MPI.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cleave/mesh/mesh.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/axis_volume.h"
#include "cleave/train/config.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

// The --set overrides this command understands: parallel.<axis>=<int>, nothing else. (To be
// routed through the config schema later; kept here, small, until then.)
MeshDegrees degrees_from(const std::vector<std::string>& overrides) {
  MeshDegrees d;
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos)
      throw Error("cleave mesh: --set expects key=value, got '" + o + "'");
    const std::string key = o.substr(0, eq);
    bool known = false;
    for (Axis a : kMeshAxes) {
      if (key != std::string("parallel.") + axis_name(a)) continue;
      d[a] = int(parse_integer(o.substr(eq + 1), key, -1, INT32_MAX));
      known = true;
    }
    if (!known)
      throw Error("cleave mesh: unknown setting '" + key +
                  "' (cleave mesh accepts parallel.pp, parallel.dp_replicate, parallel.dp_shard, "
                  "parallel.cp and parallel.tp)");
  }
  return d;
}

}  // namespace

int mesh(int argc, char** argv) {
  const Args a = Args::parse("mesh", argc, argv, {"--world", "--ranks-per-host"});
  if (a.positional.size() > 1)
    throw Error("cleave mesh: unexpected argument '" + a.positional[1] +
                "' (usage: cleave mesh [CONFIG] --world N [--set parallel.tp=2 ...] "
                "[--ranks-per-host K])");
  if (!a.has("--world")) throw Error("cleave mesh: --world N is required");
  const int world = int(a.integer("--world", 1, 1, INT32_MAX));
  // Without --ranks-per-host every rank is taken to be on one host.
  const int per_host = int(a.integer("--ranks-per-host", world, 1, INT32_MAX));
  if (a.positional.empty()) {
    const Mesh m(world, degrees_from(a.overrides));
    std::fputs(describe_mesh(m, per_host).c_str(), stdout);
    return 0;
  }
  const Config cfg = load_config(a.positional[0], a.overrides);
  const Layout layout = plan_layout(cfg.model, cfg.parallel, cfg.train, world);
  std::fputs(describe_mesh(layout.mesh, per_host).c_str(), stdout);
  std::printf("\nbytes rank 0 sends per step (%d x %d tokens per micro-batch, %d micro-batches, "
              "fp32%s):\n",
              int(layout.local_batch), cfg.train.seq_len / layout.mesh.degree(Axis::cp),
              cfg.train.grad_accum_steps,
              layout.mesh.degree(Axis::pp) > 1 ? "; its pipeline stages" : "");
  const std::vector<AxisVolume> volumes = axis_volumes(step_work(cfg.model, cfg.parallel, cfg.train, layout, 0));
  if (volumes.empty()) std::printf("  none: a single rank\n");
  for (const AxisVolume& v : volumes)
    std::printf("  %-13s %10.2f MiB (%.0f bytes)  %s\n", v.axis.c_str(), v.bytes / (1 << 20), v.bytes,
                v.how.c_str());
  return 0;
}

}  // namespace cleave::cli
