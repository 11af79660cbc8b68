// The bytes each mesh axis moves per training step on one rank: the sums of the step's
// collectives (plan/step_work.h) by the axis they are reported on, each counted as a ring (an
// all-reduce of n bytes sends 2 (p - 1) / p n from each of its p ranks, an all-gather or
// reduce-scatter (p - 1) / p n). `cleave mesh` and `cleave plan` print them, and the trainer
// logs their per-row sums as <axis>_bytes_per_step_predicted beside what it measured.
#pragma once
#include <string>
#include <vector>

#include "cleave/parallel/comm_meter.h"
#include "cleave/plan/step_work.h"

namespace cleave {

struct AxisVolume {
  // "tp", "dp" (dp_replicate x dp_shard), "dp_shard", "dp_shard x cp", "dp_replicate", "efsdp",
  // "cp", "ep", "pp"
  std::string axis;
  double bytes = 0;  // sent by one rank per step
  std::string how;   // the collectives behind the figure
  CommAxis metered = CommAxis::dp;  // the row of the step's measured traffic it predicts
};

// Per reported axis, in the order tp, efsdp, the data-parallel family's, cp, ep, pp.
std::vector<AxisVolume> axis_volumes(const StepWork& work);

// Per metered axis, the sum of its lines (each rounded to bytes): what the run's measured
// <axis>_bytes_per_step should be.
CommTraffic predicted_traffic(const std::vector<AxisVolume>& volumes);

}  // namespace cleave
