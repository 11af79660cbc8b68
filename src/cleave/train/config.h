// The training config: TOML tables [model], [data], [train], [optim]. Every key is validated
// (unknown key -> error naming it and the closest valid key; wrong type or out-of-range value ->
// error naming the key, what was given and what is allowed). `--set key=value` overrides any key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"
#include "cleave/optim/loss_scaler.h"
#include "cleave/optim/optim_config.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"

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

// The [train] table. The keys that shape the step (seq_len, the batch, activation checkpointing,
// dtype and fp8) are StepOptions, what the layout and the step program read; a base rather than a
// member, so that the table stays one level deep and every reader keeps cfg.train.seq_len.
struct TrainConfig : StepOptions {
  uint64_t seed = 1337;
  int64_t steps = 1000;
  int threads = 0;  // 0: OMP_NUM_THREADS or all cores
  int64_t log_interval = 10;
  int64_t val_interval = 100;  // 0: never
  int64_t val_batches = 8;
  int64_t checkpoint_interval = 0;  // 0: only at the end; -1: never (benchmarks)
  int64_t keep_checkpoints = 2;
  // A checkpoint's state is copied into memory at the step's end and its files written on a
  // thread of their own while training goes on (docs/checkpoints.md, Async checkpoints).
  bool async_checkpoint = false;
  // SIGTERM (a scheduler's notice before preemption) saves a checkpoint at the next step's end
  // and ends the run with exit code 0; a second SIGTERM ends it at once.
  bool checkpoint_on_signal = false;
  std::string out_dir = "runs/default";
  // A checkpoint (or a run folder: its newest) whose parameters a fresh run starts from: a fresh
  // optimizer at step 0, this run's data and schedule (fine-tuning, e.g. of `cleave import`'s
  // output). "": none. A resumed run continues from its own checkpoint instead.
  std::string init_from;
  // The peak MFU is quoted against, GF/s per rank; 0: the one mfu_peak names (train/peak.h).
  double peak_gflops = 0;
  MfuPeak mfu_peak = MfuPeak::gemm;
  // Writes a Chrome trace of step N's instructions on every rank to out_dir/trace_step_N.json
  // (0: none).
  int64_t trace_step = 0;
  // The LM head and the loss run this many tokens at a time, forward and backward together, so
  // the [tokens, vocab] logits never exist whole (0: all of a micro-batch's at once).
  int64_t loss_chunk = 0;
  // dtype "fp16" only: the dynamic loss scaler (train.loss_scale_initial, _growth_factor,
  // _growth_interval, _backoff_factor, _hysteresis, _min).
  LossScalerOptions loss_scale;
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
