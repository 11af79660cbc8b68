#include "cleave/train/layout.h"

#include <utility>

#include "cleave/base/check.h"
#include "cleave/model/tensor_parallel.h"

namespace cleave {

Layout plan_layout(const Config& cfg, int world) {
  const ParallelConfig& p = cfg.parallel;
  const std::pair<const char*, int> unbuilt[] = {{"pp (pipeline)", p.pp}, {"cp (context)", p.cp}};
  for (auto& [axis, degree] : unbuilt)
    if (degree != 1)
      throw Error("parallel." + std::string(axis).substr(0, 2) + " = " + std::to_string(degree) +
                  ": " + axis + " parallelism is not built yet; data parallelism (dp_replicate, "
                  "dp_shard) and tensor parallelism (tp) are");
  MeshDegrees d;
  d.dp_replicate = p.dp_replicate;
  d.dp_shard = p.dp_shard;
  d.tp = p.tp;
  Mesh mesh(world, d);
  const int tp = mesh.degree(Axis::tp);
  if (p.sequence_parallel && tp == 1)
    throw Error("parallel.sequence_parallel = true needs parallel.tp > 1: it splits the rows "
                "between the tensor-parallel linears over the tp ranks");
  if (tp > 1) {
    tp_share(cfg.model, tp, 0);  // heads, kv heads and hidden units split over tp
    const int64_t rows = (int64_t(cfg.model.vocab_size) + tp - 1) / tp;
    if (rows * (tp - 1) >= cfg.model.vocab_size)
      throw Error("model.vocab_size = " + std::to_string(cfg.model.vocab_size) +
                  " cannot be split over parallel.tp = " + std::to_string(tp) + ": with " +
                  std::to_string(rows) + " rows per rank the last rank would hold none");
  }
  const int dp = mesh.degree(Axis::dp_replicate) * mesh.degree(Axis::dp_shard);
  const int micro = cfg.train.micro_batch_size;
  if (micro % dp != 0)
    throw Error("train.micro_batch_size = " + std::to_string(micro) +
                " is not divisible by the data-parallel degree " + std::to_string(dp) +
                " (dp_replicate x dp_shard): every rank takes an equal slice of each micro-batch");
  const int64_t tokens = int64_t(micro / dp) * cfg.train.seq_len;
  if (p.sequence_parallel && tokens % tp != 0)
    throw Error("parallel.sequence_parallel: a rank's " + std::to_string(micro / dp) + " x " +
                std::to_string(cfg.train.seq_len) + " = " + std::to_string(tokens) +
                " tokens per micro-batch cannot be split into parallel.tp = " +
                std::to_string(tp) + " equal parts");
  return Layout{std::move(mesh), micro / dp};
}

}  // namespace cleave
