// What a training checkpoint holds (docs/architecture.md, Checkpoints): the parameters
// ("param/<name>"), the AdamW moments ("adam_m/<name>", "adam_v/<name>"), one safetensors file per
// shard of the state, and in meta.json the step, the resolved config, the data position, and for
// each tensor its global shape and the pieces each file holds. A piece is a box of the global
// tensor (offset and extent per dimension: a tp rank's rows or columns) and the range of the box's
// row-major elements the file holds (all of them, or a ZeRO shard's part), stored under its key
// with the box's shape when whole, flat when not. Pieces do not depend on the layout that wrote
// them, so any layout reads any other's.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/folder.h"
#include "cleave/model/fp8_state.h"
#include "cleave/model/params.h"
#include "cleave/model/placement.h"
#include "cleave/optim/loss_scaler.h"

namespace cleave {

std::string checkpoint_name(int64_t step);  // "step_00000042"
std::string state_file_name(int index);     // "model-rank00003.safetensors"

// One writer's part of the training state: flat ranges of the parameter buffer, their values
// and their AdamW moments.
struct StateSlices {
  std::vector<FlatRange> ranges;
  RangeBuffer values, m, v;
  TpCopy copy;  // which of the tp ranks' copies of a replicated element this writer saves
};

// Writes state file `index` into the checkpoint's temporary folder `tmp` (begin_checkpoint_folder);
// returns its checksums.
FileChecksums write_state_file(const std::string& tmp, int index, const ParamStore& params,
                             const StateSlices& state);
// What meta.json lists for state file `index` holding `ranges` of params: "<kind>/<name>" ->
// {shape, dtype, pieces}. The writer computes it (only it knows its placements) for rank 0.
nlohmann::json state_file_entries(int index, const ParamStore& params, const StateSlices& state);

// Once every state file is written: meta.json (file i's entries_of_file[i]; `config`, the run's
// resolved config as TOML, and `seed`, its train.seed), the FP8 state's file when there is one,
// and the folder swapped into place
// (finish_checkpoint_folder). written: what write_state_file returned to each file's writer (the
// ranks send it to the finisher); a file missing from it is read back for its checksums.
void finish_training_checkpoint(const std::string& dir, const std::string& tag,
                                const std::string& config, uint64_t seed, int64_t step,
                                const std::vector<nlohmann::json>& entries_of_file,
                                const std::map<int, FileChecksums>& written,
                                int64_t optimizer_steps, int world_size,
                                const LossScalerState* loss_scaler = nullptr,
                                const nlohmann::json& moe_bias = nullptr,
                                const Fp8ScalingState* fp8 = nullptr);

int64_t checkpoint_optimizer_steps(const LoadedCheckpoint& ck, const std::string& dir);
// fp16's loss scaler as the checkpoint saved it; nullopt when the run had none (it was not fp16).
std::optional<LossScalerState> checkpoint_loss_scaler(const LoadedCheckpoint& ck,
                                                      const std::string& dir);

// FP8's scales and amax histories as the checkpoint saved them (the file fp8-state.safetensors;
// format 3 kept them as JSON in meta.json); nullopt when the run was not FP8 with per-tensor scales.
std::optional<Fp8ScalingState> checkpoint_fp8_state(const LoadedCheckpoint& ck,
                                                    const std::string& dir);

// sigmoid_bias's router biases as the checkpoint saved them ("moe_bias": layer -> [experts]):
// into each of `biases` (by layer), or an error naming the layer and the checkpoint.
void read_moe_biases(const LoadedCheckpoint& ck, const std::string& dir,
                     const std::vector<std::pair<int, std::vector<float>*>>& biases);

// Checks that every tensor of params is saved under "<kind>/<name>" with the model's global
// shape, or throws naming the tensor and both shapes: before anything is read or initialised.
void check_saved_shapes(const LoadedCheckpoint& ck, const std::string& dir,
                        const ParamStore& params, const std::string& kind);

// Checks every tensor meta.json lists: its pieces lie inside it, tile it, and agree with the headers
// of the files that hold them (what check_saved_shapes checks of a model's tensors, for all).
void check_saved_pieces(const LoadedCheckpoint& ck, const std::string& dir);

// Reads the elements of `ranges` (in this model's flat layout) of the saved tensors
// "<kind>/<name>" (kind: "param", "adam_m" or "adam_v") from whichever files hold them.
void read_state(const LoadedCheckpoint& ck, const std::string& dir, const ParamStore& params,
                const std::string& kind, const std::vector<FlatRange>& ranges, RangeBuffer out);

}  // namespace cleave
