// The input is a cluster file (plan/cluster.h). parse_cluster must refuse it naming the origin, or
// return a cluster that cluster_toml writes and parse_cluster reads back to the same text; the cost
// models must then answer for it (finite, non-negative times).
#include <cmath>
#include <string>

#include "cleave/plan/cluster.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string origin = "fuzz.toml";
  Cluster c;
  if (!fuzz::accepted([&] { c = parse_cluster(text, origin); }, origin)) return 0;
  const std::string written = cluster_toml(c);
  std::string again;
  try {
    again = cluster_toml(parse_cluster(written, "written.toml"));
  } catch (const std::exception& e) {
    fuzz::finding("the cluster file cluster_toml wrote is refused: " + std::string(e.what()) +
                  "\n" + written);
  }
  if (again != written)
    fuzz::finding("cluster_toml(parse_cluster(cluster_toml(c))) differs from cluster_toml(c):\n" +
                  written + "\n---\n" + again);
  auto check = [&](double seconds, const std::string& what) {
    if (!(seconds >= 0) || std::isinf(seconds)) fuzz::finding(what + " = " + std::to_string(seconds));
  };
  for (const auto& [p, table] : c.gemm)
    for (int64_t d : {int64_t(1), int64_t(1000), int64_t(1) << 20})
      check(gemm_seconds(c, d, d + 1, d + 2, p), "gemm_seconds");
  for (LinkClass l : kLinkClasses)
    if (c.links[size_t(l)])
      for (Collective k : kCollectives)
        for (double bytes : {1.0, 1e6, 1e12})
          check(collective_seconds(c, k, l, bytes, 8), "collective_seconds");
  check(memory_seconds(c, 1e9), "memory_seconds");
  return 0;
}
