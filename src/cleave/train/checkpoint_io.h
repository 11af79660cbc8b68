// What a training checkpoint holds (DESIGN.md section 9): the parameters ("param/<name>"), the
// AdamW moments ("adam_m/<name>", "adam_v/<name>"), and in meta.json the step, the resolved
// config, the data position and each tensor's global shape and file.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cleave/checkpoint/folder.h"
#include "cleave/model/transformer.h"
#include "cleave/train/config.h"

namespace cleave {

std::string checkpoint_name(int64_t step);  // "step_00000042"

// The AdamW state over the whole flat parameter buffer (gathered from the shards under ZeRO).
struct OptimizerState {
  float* m = nullptr;
  float* v = nullptr;
  int64_t steps_taken = 0;
};

// Written by one rank: the layout that wrote a checkpoint does not matter to the one that reads it.
void save_training_checkpoint(const std::string& dir, const Config& cfg, int64_t step,
                              ParamStore& params, const OptimizerState& optim, int world_size);

// The config the checkpoint was written with.
Config checkpoint_config(const LoadedCheckpoint& ck, const std::string& dir);

// Loads parameters (and, when optim is given, the whole AdamW state) into a model built from
// `cfg`, after checking that the checkpoint's [model] matches cfg's. Returns the checkpoint's step.
int64_t restore_training_state(const LoadedCheckpoint& ck, const std::string& dir,
                               const Config& cfg, ParamStore& params, OptimizerState* optim);

// A model built from the checkpoint's own config, with its parameters, for generate and export.
// `path` is a checkpoint folder, or a run folder (its newest checkpoint is used).
std::unique_ptr<Transformer> load_model(const std::string& path, Precision precision, Config* cfg);

}  // namespace cleave
