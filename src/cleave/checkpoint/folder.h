// A checkpoint is a folder (DESIGN.md section 9): meta.json plus one safetensors file per rank,
// each file's checksum recorded in meta.json. It is written into "<dir>.tmp-<pid>" and renamed
// into place, so a crash never leaves a half-written checkpoint under the final name.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/safetensors.h"

namespace cleave {

// Writes dir/{meta.json, model-rank00000.safetensors} atomically. `meta` is stored with a
// "format" ("cleave-checkpoint"), "version" (1), and "files": {file name: checksum} added.
// An existing folder of the same name is replaced only after the new one is complete.
void write_checkpoint_folder(const std::string& dir, const nlohmann::json& meta,
                             const std::vector<TensorView>& tensors);

struct LoadedCheckpoint {
  nlohmann::json meta;
  std::vector<SafetensorsFile> files;
};

// Reads meta.json, checks format and version, verifies every file's checksum (an error names the
// file whose checksum does not match), and opens the files (in file-name order, i.e. rank order).
LoadedCheckpoint read_checkpoint_folder(const std::string& dir);

// The path (run_dir/step_NNNNNNNN) of the newest complete checkpoint under run_dir: the folder
// named "step_<digits>" with the largest number that contains meta.json ("<name>.tmp-<pid>" and
// "<name>.old-<pid>" folders are ignored), or "" if there is none.
std::string latest_checkpoint(const std::string& run_dir);

}  // namespace cleave
