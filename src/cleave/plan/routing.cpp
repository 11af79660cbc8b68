#include "cleave/plan/routing.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cleave/base/check.h"

namespace cleave {

namespace {

struct LayerSums {
  std::vector<double> kept;
  double dropped = 0;
};

// Each expert's share of a layer's choices: its kept rows over all kept and dropped; balanced
// where there were none.
std::vector<double> shares_of(const std::vector<double>& kept, double dropped) {
  double choices = dropped;
  for (double v : kept) choices += v;
  std::vector<double> share;
  for (double v : kept) share.push_back(choices > 0 ? v / choices : 1.0 / double(kept.size()));
  return share;
}

// One record's share of a layer's choices kept for experts [first, first + count).
double range_share(const std::vector<double>& shares, int first, int count) {
  double sum = 0;
  for (int e = first; e < first + count; ++e) sum += shares[size_t(e)];
  return sum;
}

}  // namespace

ExpertRouting read_routing(const std::string& run, const ModelConfig& model) {
  namespace fs = std::filesystem;
  ExpertRouting out;
  out.source = fs::is_directory(run) ? (fs::path(run) / "metrics.jsonl").string() : run;
  std::ifstream in(out.source);
  if (!in) throw Error("--routing: cannot read " + out.source + " (a run's folder or its metrics.jsonl)");
  std::map<int, LayerSums> sums;
  std::string line;
  // The highest step counted: a resumed run logs again the steps after its checkpoint, which
  // count once.
  int64_t counted = 0;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = out.source + ":" + std::to_string(number);
    try {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (!record.is_object() || !record.contains("moe_layers") || !record.contains("step")) continue;
      // A record holds the means over the steps since the one before; only the steps past those
      // counted are new.
      const int64_t step = record.at("step").get<int64_t>();
      if (step <= counted) continue;
      const double steps = double(step - counted);
      counted = step;
      std::map<int, std::vector<double>>& shares = out.records.emplace_back();
      for (const nlohmann::json& l : record.at("moe_layers")) {
        if (!l.contains("rows_per_expert")) continue;
        const int layer = l.at("layer").get<int>();
        if (layer < 0 || layer >= model.n_layers || !model.is_moe_layer(layer))
          throw Error(where + ": layer " + std::to_string(layer) + " is not a MoE layer of the "
                      "planned model (" + std::to_string(model.n_layers) + " layers)");
        const std::vector<double> kept = l.at("rows_per_expert").get<std::vector<double>>();
        if (int(kept.size()) != model.moe_experts)
          throw Error(where + ": layer " + std::to_string(layer) + " has " +
                      std::to_string(kept.size()) + " experts, the planned model model.moe_experts = " +
                      std::to_string(model.moe_experts));
        LayerSums& s = sums[layer];
        s.kept.resize(kept.size());
        for (size_t e = 0; e < kept.size(); ++e) s.kept[e] += steps * kept[e];
        const double dropped = l.at("dropped_per_step").get<double>();
        s.dropped += steps * dropped;
        shares[layer] = shares_of(kept, dropped);
      }
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(where + ": not a JSON line (" + e.what() + ")");
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": " + e.what());
    }
  }
  out.steps = counted;
  if (sums.empty())
    throw Error("--routing: " + out.source + " logs no routing (moe_layers' rows_per_expert): "
                "it is not the metrics of a MoE run");
  for (const auto& [layer, s] : sums) out.share[layer] = shares_of(s.kept, s.dropped);
  return out;
}

double peak_share(const ExpertRouting* routing, int layer, int experts, int first, int count) {
  double peak = 0;
  bool found = false;
  if (routing)
    for (const auto& record : routing->records)
      if (auto it = record.find(layer); it != record.end()) {
        peak = std::max(peak, range_share(it->second, first, count));
        found = true;
      }
  return found ? peak : double(count) / double(experts);
}

double busiest_rank_share(const ExpertRouting* routing, int layer, int experts, int ep) {
  const int per_rank = experts / ep;
  double sum = 0;
  int records = 0;
  if (routing)
    for (const auto& record : routing->records)
      if (auto it = record.find(layer); it != record.end()) {
        double busiest = 0;
        for (int r = 0; r < ep; ++r)
          busiest = std::max(busiest, range_share(it->second, r * per_rank, per_rank));
        sum += busiest;
        ++records;
      }
  return records > 0 ? sum / records : 1.0 / double(ep);
}

std::vector<double> expert_shares(const ExpertRouting* routing, int layer, int experts) {
  if (routing) {
    auto it = routing->share.find(layer);
    if (it != routing->share.end()) return it->second;
  }
  return std::vector<double>(size_t(experts), 1.0 / double(experts));
}

}  // namespace cleave
