// A checkpoint is a folder (docs/architecture.md, Checkpoints): meta.json plus one safetensors file
// per rank, each file's checksums (its header's and each chunk's of every tensor) recorded in
// meta.json. It is written into "<dir>.tmp-<pid>" and
// renamed into place, so a crash never leaves a half-written checkpoint under the final name.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/safetensors.h"

namespace cleave {

// Writing a checkpoint from several ranks: one rank begins (the temporary folder
// "<dir>.tmp-<tag>", tag shared by the ranks: a stale one of the same name is removed), every
// writer puts its file into checkpoint_temp_folder(dir, tag), and after all have finished one rank
// finishes: it records each file's checksums in meta.json together with "format"
// ("cleave-checkpoint") and "version", makes everything durable, and swaps the folder into place
// (an existing folder of the same name is replaced only then). `files` maps each file name to its
// checksums as write_safetensors returned them to its writer (the finisher checks that the file
// is visible from here with that size), or to nullopt: the finisher reads such a file back.
std::string checkpoint_temp_folder(const std::string& dir, const std::string& tag);
void begin_checkpoint_folder(const std::string& dir, const std::string& tag);
void finish_checkpoint_folder(const std::string& dir, const std::string& tag,
                              const nlohmann::json& meta,
                              const std::map<std::string, std::optional<FileChecksums>>& files);
// Removes the temporary folder of a checkpoint that failed.
void abandon_checkpoint_folder(const std::string& dir, const std::string& tag);

// One writer: dir/{meta.json, model-rank00000.safetensors} written atomically as above.
void write_checkpoint_folder(const std::string& dir, const nlohmann::json& meta,
                             const std::vector<TensorView>& tensors);

struct LoadedCheckpoint {
  nlohmann::json meta;
  std::vector<SafetensorsFile> files;
  uint64_t meta_bytes = 0;  // meta.json's size
  // Bytes read from the checkpoint so far: meta.json, and what the files read.
  uint64_t bytes_read() const;
};

// Reads meta.json, checks format and version, and opens the files (in file-name order, i.e. rank
// order), checking each one's size and header against its checksums: a file cut off or replaced
// is named here, and a tensor's bytes are verified as they are read (format 4). Formats 1-3 keep
// one checksum per file, verified here by reading every file whole.
LoadedCheckpoint read_checkpoint_folder(const std::string& dir);

// The path (run_dir/step_NNNNNNNN) of the newest complete checkpoint under run_dir: the folder
// named "step_<digits>" with the largest number that contains meta.json ("<name>.tmp-<pid>" and
// "<name>.old-<pid>" folders are ignored), or "" if there is none.
std::string latest_checkpoint(const std::string& run_dir);
// The same folders, newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& run_dir);

}  // namespace cleave
