// `cleave plan --report FILE.html`: the plan as one static page (no server, no network: inline
// SVG, CSS and a few lines of script), in sections a browser test finds by id: the device mesh
// (every rank a cell coloured by its group on the axis chosen, hosts boxed), the memory breakdown
// per pipeline stage against the device's capacity, the pipeline timeline of the schedule's
// simulation, and the bytes each mesh axis moves per step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/mesh/mesh.h"
#include "cleave/pipeline/schedule.h"
#include "cleave/plan/memory.h"

namespace cleave {

struct AxisBytes {
  std::string axis;
  double bytes = 0;  // per step, sent by one rank
  std::string how;
};

struct PlanReport {
  std::string title;
  const Mesh* mesh = nullptr;
  int ranks_per_host = 0;        // 0: every rank on one host
  std::vector<MemoryPlan> stages;  // per pp rank
  int64_t capacity_bytes = 0;    // memory per device; 0: not known
  std::vector<TraceEvent> timeline;  // the schedule's simulated actions, per pp rank
  std::vector<AxisBytes> axes;
};

std::string plan_report_html(const PlanReport& report);

}  // namespace cleave
