// Bytes each mesh axis moves per training step, for rank 0, from the config alone (`cleave mesh
// CONFIG`, and the trainer's <axis>_bytes_per_step_predicted beside the measured figure).
// Every collective is counted as a ring: an all-reduce of n floats sends 2 (p - 1) / p n 4 bytes
// from each of its p ranks, an all-gather or reduce-scatter of a whole n-float tensor
// (p - 1) / p n 4.
#pragma once
#include <string>
#include <vector>

#include "cleave/parallel/comm_meter.h"
#include "cleave/train/config.h"
#include "cleave/parallel/layout.h"

namespace cleave {

struct AxisVolume {
  // "tp", "dp" (dp_replicate x dp_shard), "dp_shard", "dp_replicate", "efsdp", "cp", "ep", "pp"
  std::string axis;
  double bytes = 0;  // sent by one rank per step
  std::string how;   // the collectives behind the figure
  // The row of the step's measured traffic it predicts (the data-parallel family's are dp's).
  CommAxis metered() const;
};

// Per metered axis, the sum of its lines: what the run's measured <axis>_bytes_per_step should be.
CommTraffic predicted_traffic(const std::vector<AxisVolume>& volumes);

// For rank 0 of the layout: under pp, the stages it runs (the first's, with the embeddings).
std::vector<AxisVolume> comm_volume(const Config& cfg, const Layout& layout);

}  // namespace cleave
