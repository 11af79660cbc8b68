// The simulated timeline of a checked schedule, as text (one row per rank) and as a Chrome trace.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

namespace {

// "F3" when each rank holds one stage (the row says which); "5F3" when it holds several.
std::string label(const Action& a, bool with_stage) {
  const std::string text = to_string(a);
  return with_stage ? text : text.substr(std::to_string(a.stage).size());
}

void check_matches(const Schedule& s, const ScheduleCheck& c) {
  bool ok = int(s.ranks.size()) == s.pp && int(c.start.size()) == s.pp &&
            int(c.end.size()) == s.pp;
  for (int r = 0; ok && r < s.pp; ++r)
    ok = c.start[r].size() == s.ranks[r].size() && c.end[r].size() == s.ranks[r].size();
  if (!ok) throw Error("the check result does not belong to schedule '" + s.name + "'");
}

}  // namespace

std::string timeline_text(const Schedule& s, const ScheduleCheck& c) {
  check_matches(s, c);
  const bool with_stage = c.stages.chunks_per_rank > 1;
  size_t widest = 1;
  double shortest = 0;
  for (int r = 0; r < s.pp; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const double d = c.end[r][i] - c.start[r][i];
      if (!is_compute(s.ranks[r][i].type) || d <= 0) continue;
      widest = std::max(widest, label(s.ranks[r][i], with_stage).size());
      shortest = shortest == 0 ? d : std::min(shortest, d);
    }
  if (shortest == 0) shortest = 1;
  // Columns per time unit: the shortest action still shows its whole label and a space.
  const double cols = std::ceil(double(widest + 1) / shortest);
  auto col = [&](double t) { return size_t(std::llround(t * cols)); };
  const size_t width = col(c.makespan);
  const std::string last_rank = "rank " + std::to_string(s.pp - 1);
  const size_t margin = last_rank.size() + 2;

  // The time axis: a number at every tick, ticks as close as their numbers allow.
  const size_t digits = std::to_string(long(std::ceil(c.makespan))).size();
  long tick = 1;
  for (long base = 1; double(tick) * cols < double(digits + 1); base *= 10)
    for (long step : {1, 2, 5}) {
      tick = base * step;
      if (double(tick) * cols >= double(digits + 1)) break;
    }
  std::string axis = "time" + std::string(margin - 4, ' ') + std::string(width + digits, ' ');
  for (long t = 0; double(t) <= c.makespan; t += tick) {
    const std::string n = std::to_string(t);
    axis.replace(margin + col(double(t)), n.size(), n);
  }
  std::string out = axis.substr(0, axis.find_last_not_of(' ') + 1) + "\n";

  for (int r = 0; r < s.pp; ++r) {
    const std::string name = "rank " + std::to_string(r);
    std::string row = name + std::string(margin - name.size(), ' ') + std::string(width, '.');
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (!is_compute(a.type)) continue;
      const size_t b = margin + col(c.start[r][i]), e = margin + col(c.end[r][i]);
      if (e <= b) continue;
      const std::string l = label(a, with_stage).substr(0, e - b - 1);
      row.replace(b, e - b, l + std::string(e - b - l.size(), ' '));
    }
    out += row.substr(0, row.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

std::vector<TraceEvent> simulated_trace(const Schedule& s, const ScheduleCheck& c,
                                        double us_per_unit) {
  check_matches(s, c);
  std::vector<TraceEvent> events;
  for (int r = 0; r < s.pp; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      if (!is_compute(s.ranks[r][i].type)) continue;
      TraceEvent e;
      e.rank = r;
      e.name = to_string(s.ranks[r][i]);
      e.start_us = c.start[r][i] * us_per_unit;
      e.duration_us = (c.end[r][i] - c.start[r][i]) * us_per_unit;
      events.push_back(e);
    }
  return events;
}

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events) {
  nlohmann::json list = nlohmann::json::array();
  std::set<int> ranks, comm_ranks;
  // Compute spans on track `rank`, a rank's communication on track kCommTrack + rank, sorted
  // right under it.
  constexpr int kCommTrack = 1 << 20;
  for (const TraceEvent& e : events) {
    const bool comm = e.bytes >= 0;
    nlohmann::json event = {{"name", e.name}, {"cat", comm ? "comm" : "compute"},
                            {"ph", "X"}, {"pid", 0},
                            {"tid", comm ? kCommTrack + e.rank : e.rank},
                            {"ts", e.start_us}, {"dur", e.duration_us}};
    if (comm) event["args"] = {{"bytes", e.bytes}, {"group", e.group}};
    list.push_back(std::move(event));
    (comm ? comm_ranks : ranks).insert(e.rank);
  }
  for (int r : ranks) {
    list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                    {"args", {{"name", "rank " + std::to_string(r)}}}});
    list.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                    {"args", {{"sort_index", 2 * r}}}});
  }
  for (int r : comm_ranks) {
    list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", kCommTrack + r},
                    {"args", {{"name", "rank " + std::to_string(r) + " comm"}}}});
    list.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", kCommTrack + r},
                    {"args", {{"sort_index", 2 * r + 1}}}});
  }
  // A viewer never loads half a trace.
  const nlohmann::json trace = {{"traceEvents", list}, {"displayTimeUnit", "ms"}};
  write_file_atomic(path, trace.dump() + "\n", "trace");
}

}  // namespace cleave
