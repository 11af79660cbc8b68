// Schedules as CSV files (docs/pipeline_parallel.md#csv-format): one line per rank, one action
// per cell, PyTorch's action text; '#' lines are comments.
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

namespace {

// A schedule of 64 ranks x 4096 micro-batches of zbv is some 40 MB of text.
constexpr int64_t kMaxScheduleBytes = 256 * kMiB;

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

Schedule load_schedule_csv(const std::string& path) {
  std::istringstream in(read_bounded_file(path, "pipeline schedule", kMaxScheduleBytes));
  Schedule s;
  s.name = path;
  int max_stage = -1, max_mb = -1;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const std::string content = trimmed(line);
    if (content.empty() || content[0] == '#') continue;
    std::vector<Action> actions;
    std::stringstream cells(line);
    std::string cell;
    for (int cell_no = 1; std::getline(cells, cell, ','); ++cell_no) {
      const std::string text = trimmed(cell);
      if (text.empty()) continue;  // trailing or aligning commas
      try {
        actions.push_back(parse_action(text));
      } catch (const Error& e) {
        throw Error(path + " line " + std::to_string(line_no) + " (rank " +
                    std::to_string(s.ranks.size()) + "), cell " + std::to_string(cell_no) + ": " +
                    e.what());
      }
      max_stage = std::max(max_stage, actions.back().stage);
      max_mb = std::max(max_mb, actions.back().mb);
    }
    s.ranks.push_back(std::move(actions));
  }
  if (max_stage < 0) throw Error("pipeline schedule " + path + " has no actions");
  // Every micro-batch runs forward through every stage: a schedule naming more pairs than it has
  // actions is wrong, and its sizes must not be allocated (stage 999999999 in 12 bytes).
  int64_t n_actions = 0;
  for (const auto& rank : s.ranks) n_actions += int64_t(rank.size());
  if ((int64_t(max_stage) + 1) * (int64_t(max_mb) + 1) > n_actions)
    throw Error("pipeline schedule " + path + " names stage " + std::to_string(max_stage) +
                " and micro-batch " + std::to_string(max_mb) + " but holds only " +
                std::to_string(n_actions) + " actions: every micro-batch runs forward through "
                "every stage");
  s.pp = int(s.ranks.size());
  s.n_stages = max_stage + 1;
  s.microbatches = max_mb + 1;
  return s;
}

void save_schedule_csv(const Schedule& s, const std::string& path) {
  std::ostringstream out;
  out << "# cleave pipeline schedule '" << s.name << "': pp " << s.pp << ", " << s.n_stages
      << " stages, " << s.microbatches << " micro-batches; one line per rank\n";
  for (const std::vector<Action>& rank : s.ranks) {
    for (size_t i = 0; i < rank.size(); ++i) out << (i ? "," : "") << to_string(rank[i]);
    out << '\n';
  }
  // A reader never sees half a schedule.
  write_file_atomic(path, out.str(), "pipeline schedule");
}

}  // namespace cleave
