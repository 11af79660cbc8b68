// Bytes each mesh axis moves per training step, for rank 0, from the config alone (`cleave mesh
// CONFIG`; bench/tp.sh compares the tp figure with the trainer's measured tp_bytes_per_step).
// Every collective is counted as a ring: an all-reduce of n floats sends 2 (p - 1) / p n 4 bytes
// from each of its p ranks, an all-gather or reduce-scatter of a whole n-float tensor
// (p - 1) / p n 4.
#pragma once
#include <string>
#include <vector>

#include "cleave/train/config.h"
#include "cleave/train/layout.h"

namespace cleave {

struct AxisVolume {
  std::string axis;  // "tp", "dp" (dp_replicate x dp_shard), "dp_shard", "dp_replicate", "pp"
  double bytes = 0;  // sent by one rank per step
  std::string how;   // the collectives behind the figure
};

// For rank 0 of the layout: under pp, the stages it runs (the first's, with the embeddings).
std::vector<AxisVolume> comm_volume(const Config& cfg, const Layout& layout);

}  // namespace cleave
