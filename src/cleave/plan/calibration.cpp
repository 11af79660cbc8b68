#include "cleave/plan/calibration.h"

#include <map>

#include "cleave/base/check.h"

namespace cleave {

std::vector<std::tuple<int64_t, int, int>> calibration_shapes(const std::vector<int>& dims) {
  std::vector<std::tuple<int64_t, int, int>> shapes;
  for (int tokens : dims)
    for (int in : dims)
      for (int out : dims) shapes.emplace_back(tokens, in, out);
  return shapes;
}

GemmSample gemm_sample(const GemmBenchResult& r) {
  CLEAVE_CHECK(r.seconds > 0, "a GEMM pass '" << r.pass << "' without a time");
  const double seconds = r.seconds;
  if (r.pass == "fwd") return {r.N, r.out, r.in, seconds, r.pass};
  if (r.pass == "bwd_input") return {r.N, r.in, r.out, seconds, r.pass};
  CLEAVE_CHECK(r.pass == "bwd_weight", "a GEMM pass named '" << r.pass << "'");
  return {r.out, r.in, r.N, seconds, r.pass};
}

GemmTable gemm_table(const std::vector<GemmSample>& samples, const std::string& where) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<double, int>> sums;
  for (const GemmSample& s : samples) {
    auto& [seconds, count] = sums[{s.m, s.n, s.k}];
    seconds += s.seconds;
    ++count;
  }
  std::vector<GemmPoint> points;
  for (const auto& [shape, sum] : sums) {
    const auto [m, n, k] = shape;
    const double seconds = sum.first / sum.second;
    points.push_back({m, n, k, 2.0 * double(m) * double(n) * double(k) / seconds * 1e-9});
  }
  return GemmTable(std::move(points), where);
}

LinkCosts fit_link(const std::vector<CommBenchRow>& rows, int ranks) {
  LinkCosts costs;
  for (Collective kind : kCollectives) {
    std::vector<CommPoint> points;
    for (const CommBenchRow& r : rows)
      if (r.op == collective_name(kind)) points.push_back({double(r.bytes), r.seconds});
    costs[size_t(kind)] = fit_collective(kind, ranks, points);
  }
  return costs;
}

}  // namespace cleave
