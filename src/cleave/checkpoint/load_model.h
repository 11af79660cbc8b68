// A model back from a training checkpoint, without the trainer: built from the [model] table of
// the config the checkpoint was written with, its parameters (and sigmoid_bias's router biases)
// read whole into one process, whatever layout wrote them. For generate, export and serving.
#pragma once
#include <memory>
#include <string>

#include "cleave/kernels/linear.h"
#include "cleave/model/transformer.h"

namespace cleave {

struct LoadedModel {
  std::unique_ptr<Transformer> model;  // its config(): the checkpoint's [model]
  std::string data_dir;                // the run's data.dir, which holds its tokenizer.model
  std::string dir;                     // the checkpoint folder read
};

// `path` is a checkpoint folder, or a run folder (its newest checkpoint is used).
LoadedModel load_model(const std::string& path, Precision precision);

}  // namespace cleave
