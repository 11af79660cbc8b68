// The [parallel] table: how the world's ranks divide a job (train/config.h reads it from TOML).
#pragma once
#include <string>
#include <vector>

namespace cleave {

// The device mesh degrees (-1: the rest of the world) and how data parallelism shards state.
// tp splits every layer's matrix products (docs/tensor_parallel.md); sequence_parallel also
// splits the rows between them; check_placements verifies at module boundaries that every tp
// rank holds what the module expects (slow: for debugging a layout).
// dp_replicate ranks hold replicas (gradients all-reduced); dp_shard ranks shard what zero_stage
// says: 0 nothing (DDP), 1 optimizer state, 2 also gradients (reduce-scatter), 3 also parameters.
struct ParallelConfig {
  int pp = 1, dp_replicate = 1, dp_shard = -1, cp = 1, tp = 1;
  // Expert parallelism (docs/moe.md): a MoE model's experts split over ep ranks carved out of
  // dp_shard x cp (torchtitan's layout); the experts' ZeRO shards over the rest of it (efsdp).
  int ep = 1;
  int zero_stage = 0;
  // Pipeline parallelism (docs/pipeline_parallel.md): the schedule by name (gpipe, 1f1b,
  // interleaved, zb1p, zbv) or from a CSV file (pp_schedule_csv, which wins), the virtual chunks
  // per rank (0: the schedule's own, 2 for interleaved and zbv, else 1), and the layers of each
  // stage in stage order (empty: balanced by count, the earlier stages taking any remainder).
  std::string pp_schedule = "1f1b";
  int pp_virtual = 0;
  std::vector<int> pp_layers;
  std::string pp_schedule_csv;
  // Context parallelism (docs/context_parallel.md): ring, allgather, ulysses or hybrid (Ulysses
  // over groups of cp_ulysses ranks inside a ring over cp / cp_ulysses of them).
  std::string cp_mode = "ring";
  int cp_ulysses = 0;
  bool sequence_parallel = false;
  bool check_placements = false;
  double bucket_mb = 25;         // DDP gradient buckets, MiB
  // "file" (ZeRO-3 only): the fp32 master shards live in a memory-mapped file in
  // optim.offload_dir, read in before each unit's gather and update and dropped after.
  std::string offload_params = "none";
  // ZeRO-3 with train.dtype "fp8": the FP8 linears' weights are gathered as FP8 bytes
  // (parallel/fp8_allgather.h).
  bool fp8_allgather = false;
  double comm_timeout_s = 300;   // a collective taking longer aborts the job with a report
  std::string status_dir;        // where ranks publish progress for that report ("" = /tmp);
                                 // a folder every host shares lets it show ranks on every host
};

}  // namespace cleave
