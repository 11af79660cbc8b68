// What `cleave checkpoint info` and `cleave checkpoint verify` tell of a checkpoint folder.
#pragma once
#include <string>

#include "cleave/checkpoint/folder.h"

namespace cleave {

// Step, format, the layout that wrote it (its config's [parallel] table and dtype), size, and every
// tensor with its dtype, shape and pieces: file, key, box, element range, bytes and checksums.
std::string describe_checkpoint(const LoadedCheckpoint& ck, const std::string& dir);

// Reads every byte of every file and checks every checksum, and checks that every tensor's pieces
// tile it; throws naming the file, tensor and bytes at fault. Returns a one-line summary.
std::string verify_checkpoint(const std::string& dir);

}  // namespace cleave
