#include "cleave/train/layout.h"

#include <utility>

#include "cleave/base/check.h"

namespace cleave {

Layout plan_layout(const Config& cfg, int world) {
  const ParallelConfig& p = cfg.parallel;
  const std::pair<const char*, int> unbuilt[] = {
      {"pp (pipeline)", p.pp}, {"cp (context)", p.cp}, {"tp (tensor)", p.tp}};
  for (auto& [axis, degree] : unbuilt)
    if (degree != 1)
      throw Error("parallel." + std::string(axis).substr(0, 2) + " = " + std::to_string(degree) +
                  ": " + axis + " parallelism is not built yet; only data parallelism "
                  "(dp_replicate, dp_shard) is");
  MeshDegrees d;
  d.dp_replicate = p.dp_replicate;
  d.dp_shard = p.dp_shard;
  Mesh mesh(world, d);
  const int dp = mesh.degree(Axis::dp_replicate) * mesh.degree(Axis::dp_shard);
  const int micro = cfg.train.micro_batch_size;
  if (micro % dp != 0)
    throw Error("train.micro_batch_size = " + std::to_string(micro) +
                " is not divisible by the data-parallel degree " + std::to_string(dp) +
                " (dp_replicate x dp_shard): every rank takes an equal slice of each micro-batch");
  return Layout{std::move(mesh), micro / dp};
}

}  // namespace cleave
