// The training config: TOML tables [model], [data], [train], [optim]. Every key is validated
// (unknown key -> error naming it and the closest valid key; wrong type or out-of-range value ->
// error naming the key, what was given and what is allowed). `--set key=value` overrides any key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/kernels/linear.h"
#include "cleave/model/model_config.h"
#include "cleave/optim/loss_scaler.h"
#include "cleave/parallel/fp8_scaling.h"
#include "cleave/optim/optim_config.h"

namespace cleave {

struct DataConfig {
  std::string dir = "data/fortunes";  // tokenizer.model, train.bin, val.bin
  std::string corpus;                 // text file `cleave tokenize` reads
  double val_fraction = 0.05;
  bool document_mask = false;    // attention stays inside each document of a window
  bool reset_positions = false;  // positions restart at each document
  int document_separator = 2;    // the id that ends a document (cleave tokenize's end of text)
};

// What MFU is quoted against when train.peak_gflops is 0: the GEMM peak measured on this machine
// (cached per machine, oneDNN version, dtype and threads), or the hardware's FMA peak.
enum class MfuPeak { gemm, hardware };

struct TrainConfig {
  uint64_t seed = 1337;
  int seq_len = 256;
  int micro_batch_size = 4;
  int grad_accum_steps = 1;
  int64_t steps = 1000;
  Precision dtype = Precision::fp32;
  int threads = 0;  // 0: OMP_NUM_THREADS or all cores
  int64_t log_interval = 10;
  int64_t val_interval = 100;  // 0: never
  int64_t val_batches = 8;
  int64_t checkpoint_interval = 0;  // 0: only at the end; -1: never (benchmarks)
  int64_t keep_checkpoints = 2;
  std::string out_dir = "runs/default";
  // The peak MFU is quoted against, GF/s per rank; 0: the one mfu_peak names (train/peak.h).
  double peak_gflops = 0;
  MfuPeak mfu_peak = MfuPeak::gemm;
  // Writes a Chrome trace of step N's instructions on every rank to out_dir/trace_step_N.json
  // (0: none).
  int64_t trace_step = 0;
  // The LM head and the loss run this many tokens at a time, forward and backward together, so
  // the [tokens, vocab] logits never exist whole (0: all of a micro-batch's at once).
  int64_t loss_chunk = 0;
  // Activation checkpointing: "none", or "full" (a checkpointed block keeps only its input and
  // runs its forward again before its backward), on every ac_every-th block (layers 0, N, 2N...).
  std::string activation_checkpointing = "none";
  int ac_every = 1;
  // dtype "fp16" only: the dynamic loss scaler (train.loss_scale_initial, _growth_factor,
  // _growth_interval, _backoff_factor, _hysteresis, _min).
  LossScalerOptions loss_scale;
  // dtype "fp8" only: the recipe and its scaling (train.fp8_recipe, _margin,
  // _amax_history_len, _amax_compute_algo).
  Fp8Options fp8;
};

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

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
};

// Parses TOML text (`origin` names the file in errors), applies the overrides ("key=value", the
// value in TOML syntax or a bare string), validates and resolves family defaults.
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The resolved config as TOML text: every key, defaults filled in. parse_config(to_toml(c)) == c.
std::string to_toml(const Config& c);

// Every key the schema knows, dotted ("model.d_model").
std::vector<std::string> config_keys();

}  // namespace cleave
