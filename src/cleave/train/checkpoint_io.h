// What a training checkpoint holds (docs/architecture.md, Checkpoints): the parameters
// ("param/<name>"), the AdamW moments ("adam_m/<name>", "adam_v/<name>"), one safetensors file per
// shard of the state, and in meta.json the step, the resolved config, the data position, and for
// each tensor its global shape and the pieces (element ranges of the flattened tensor) each file
// holds. A file stores a piece under the tensor's name: with the tensor's shape when it is whole,
// flat when not. Element ranges do not depend on the layout that wrote them, so any layout reads
// any other's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/checkpoint/folder.h"
#include "cleave/model/transformer.h"
#include "cleave/train/config.h"

namespace cleave {

std::string checkpoint_name(int64_t step);  // "step_00000042"
std::string state_file_name(int index);     // "model-rank00003.safetensors"

// One writer's part of the training state: flat ranges of the parameter buffer, their values
// and their AdamW moments.
struct StateSlices {
  std::vector<FlatRange> ranges;
  RangeBuffer values, m, v;
};

// Writes state file `index` into the checkpoint's temporary folder `tmp` (begin_checkpoint_folder);
// returns its checksum.
std::string write_state_file(const std::string& tmp, int index, const ParamStore& params,
                      const StateSlices& state);

// Once every state file is written: meta.json (file i holds ranges_of_file[i]) and the folder
// swapped into place (finish_checkpoint_folder). own_file, own_checksum: the file this rank wrote
// (-1: none) and what write_state_file returned; the other files are read back for theirs.
void finish_training_checkpoint(const std::string& dir, const std::string& tag, const Config& cfg,
                                int64_t step, const ParamStore& params,
                                const std::vector<std::vector<FlatRange>>& ranges_of_file,
                                int own_file, const std::string& own_checksum,
                                int64_t optimizer_steps, int world_size);

// The config the checkpoint was written with.
Config checkpoint_config(const LoadedCheckpoint& ck, const std::string& dir);

// Checks that the checkpoint's [model] matches cfg's; returns the checkpoint's step.
int64_t checkpoint_step(const LoadedCheckpoint& ck, const std::string& dir, const Config& cfg);
int64_t checkpoint_optimizer_steps(const LoadedCheckpoint& ck, const std::string& dir);

// Reads the elements of `ranges` (in this model's flat layout) of the saved tensors
// "<kind>/<name>" (kind: "param", "adam_m" or "adam_v") from whichever files hold them.
void read_state(const LoadedCheckpoint& ck, const std::string& dir, const ParamStore& params,
                const std::string& kind, const std::vector<FlatRange>& ranges, RangeBuffer out);

// A model built from the checkpoint's own config, with its parameters, for generate and export.
// `path` is a checkpoint folder, or a run folder (its newest checkpoint is used).
std::unique_ptr<Transformer> load_model(const std::string& path, Precision precision, Config* cfg);

}  // namespace cleave
