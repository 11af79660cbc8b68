#include "cleave/plan/axis_volume.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace cleave {

std::vector<AxisVolume> axis_volumes(const StepWork& work) {
  struct Line {
    int count = 0;
    double sent = 0;
  };
  // Per axis, per (kind, what): how many collectives and the bytes they send.
  std::map<std::string, AxisVolume> axes;
  std::map<std::string, std::vector<std::pair<std::string, Line>>> lines;
  for (const auto& w : work.work)
    for (const CommCall& c : w->comms) {
      AxisVolume& v = axes[c.axis];
      v.axis = c.axis;
      v.metered = c.metered;
      v.bytes += c.sent();
      const std::string key = std::string(collective_name(c.kind)) + " of " + c.what;
      auto& list = lines[c.axis];
      auto it = list.begin();
      while (it != list.end() && it->first != key) ++it;
      if (it == list.end()) it = list.insert(list.end(), {key, Line{}});
      it->second.count += c.repeats;
      it->second.sent += c.sent();
    }
  std::vector<AxisVolume> out;
  for (const char* name : {"tp", "efsdp", "dp", "dp_shard", "dp_shard x cp", "dp_replicate", "cp",
                           "ep", "pp"}) {
    auto a = axes.find(name);
    if (a == axes.end()) continue;
    AxisVolume v = a->second;
    for (const auto& [key, line] : lines[name]) {
      char figure[64];
      std::snprintf(figure, sizeof figure, ": %.3f MiB", line.sent / (1 << 20));
      v.how += (v.how.empty() ? "" : "; ") + std::to_string(line.count) + " x " + key + figure;
    }
    out.push_back(v);
  }
  return out;
}

CommTraffic predicted_traffic(const std::vector<AxisVolume>& volumes) {
  CommTraffic t;
  for (const AxisVolume& v : volumes) t[v.metered].bytes += std::llround(v.bytes);
  return t;
}

}  // namespace cleave
