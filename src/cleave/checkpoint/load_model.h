// A model back from a training checkpoint, without the trainer: built from the [model] table of
// the config the checkpoint was written with, its parameters (and sigmoid_bias's router biases)
// read from whatever layout wrote them into the layout asked for: the whole model in one process,
// or a tensor-parallel rank's slices, each rank reading only its own. For generate, export and
// serving.
#pragma once
#include <memory>
#include <string>

#include "cleave/checkpoint/folder.h"
#include "cleave/kernels/linear.h"
#include "cleave/model/transformer.h"

namespace cleave {

// A checkpoint found and its model's config read, before any parameter is.
struct ModelCheckpoint {
  std::string dir;       // the checkpoint folder
  std::string data_dir;  // the run's data.dir, which holds its tokenizer.model
  ModelConfig model;
  uint64_t seed = 0;
  LoadedCheckpoint ck;
};

struct LoadedModel {
  std::unique_ptr<Transformer> model;  // its config(): the checkpoint's [model]
  std::string data_dir;                // the run's data.dir, which holds its tokenizer.model
  std::string dir;                     // the checkpoint folder read
};

// `path` is a checkpoint folder, or a run folder (its newest checkpoint is used).
ModelCheckpoint open_model_checkpoint(const std::string& path);
// tp: the rank's share (docs/tensor_parallel.md; sequence parallelism off), chunks its pipeline
// stages (empty: the whole model) and ep its expert-parallel group (its E / ep experts of every
// MoE layer), read as its slices.
LoadedModel load_model(const ModelCheckpoint& opened, Precision precision,
                       const TensorParallelOptions& tp = {}, std::vector<ModelChunk> chunks = {},
                       EpComm* ep = nullptr);
LoadedModel load_model(const std::string& path, Precision precision);

}  // namespace cleave
