// `cleave plan --report FILE.html`: the plan as one static page (no server, no network: inline
// SVG, CSS and a few lines of script), in sections a browser test finds by id: the device mesh
// (every rank a cell coloured by its group on the axis chosen, hosts boxed), the memory breakdown
// per pipeline stage against the device's capacity, the pipeline timeline (the step program
// simulated on a cluster's costs, or the schedule's on unit costs), the bytes each mesh axis moves
// per step, and for a search the ranked layouts.
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

// A layout of a search, as the report lists it.
struct RankedLayout {
  std::string label;
  double tokens_per_second = 0, step_seconds = 0, mfu = 0;
  int64_t peak_bytes = 0;
};

struct PlanReport {
  std::string title;
  const Mesh* mesh = nullptr;
  int ranks_per_host = 0;        // 0: every rank on one host
  std::vector<MemoryPlan> stages;  // per pp rank
  int64_t capacity_bytes = 0;    // memory per device; 0: not known
  std::vector<TraceEvent> timeline;  // each pp rank's schedule actions
  // What timed them: the cluster's name (its cost model, times in ms), or empty (the schedule's
  // unit costs: F 1, B 2).
  std::string timeline_cluster;
  std::vector<AxisBytes> axes;
  std::vector<RankedLayout> ranked;  // --search: the best layouts that fit, best first
};

std::string plan_report_html(const PlanReport& report);

}  // namespace cleave
