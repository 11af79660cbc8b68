// cluster_info CLUSTER.toml
//
// Reads a cluster file with cleave's reader (plan/cluster.h) and prints every figure, one a line,
// with the models' predictions for a few cases, so a script can check a file `cleave calibrate`
// wrote (integration/calibrate_test.sh):
//   cluster NAME devices_per_host N memory_gib X memory_gbps X
//   peak DTYPE GF/s | peak DTYPE unknown
//   rates elementwise_gbps X pack_gbps X refault_gbps X refault_huge_gbps X fp8_gbps X   (0: absent)
//   compute_imbalance X                       (0: absent)
//   attention KEYS gflops X seconds_1024 S     (each point; attention_seconds of 1024 queries and keys)
//   gemm DTYPE POINTS seconds_1024 S          (gemm_seconds of a 1024^3 product)
//   link CLASS COLLECTIVE lines N alpha_us A beta_gbps B seconds_1MiB S
//     (the first line's alpha and beta; collective_seconds of 1 MiB over 2 ranks)
// Errors go to stderr with exit code 1.
#include <cstdio>
#include <exception>

#include "cleave/plan/cluster.h"

int main(int argc, char** argv) {
  using namespace cleave;
  if (argc != 2) {
    std::fprintf(stderr, "usage: cluster_info CLUSTER.toml\n");
    return 2;
  }
  try {
    const Cluster c = read_cluster(argv[1]);
    std::printf("cluster %s devices_per_host %d memory_gib %g memory_gbps %g\n", c.name.c_str(),
                c.devices_per_host, c.memory_gib, c.memory_gbps);
    for (Precision p : kClusterDtypes) {
      auto it = c.peak_gflops.find(p);
      if (it == c.peak_gflops.end()) std::printf("peak %s unknown\n", precision_name(p));
      else std::printf("peak %s %g\n", precision_name(p), it->second);
    }
    std::printf("rates elementwise_gbps %g pack_gbps %g refault_gbps %g refault_huge_gbps %g fp8_gbps %g\n",
                c.elementwise_gbps, c.pack_gbps, c.refault_gbps, c.refault_huge_gbps, c.fp8_gbps);
    std::printf("compute_imbalance %g\n", c.compute_imbalance);
    for (const AttentionRate& r : c.attention)
      std::printf("attention %lld gflops %g seconds_1024 %g\n", (long long)r.keys, r.gflops,
                  attention_seconds(c, 1024, 1024, 64));
    for (const auto& [p, table] : c.gemm)
      std::printf("gemm %s %zu seconds_1024 %g\n", precision_name(p), table.points().size(),
                  gemm_seconds(c, 1024, 1024, 1024, p));
    for (LinkClass l : kLinkClasses) {
      if (!c.links[size_t(l)]) continue;
      for (Collective k : kCollectives) {
        const CollectiveCost& cost = (*c.links[size_t(l)])[size_t(k)];
        std::printf("link %s %s lines %zu alpha_us %g beta_gbps %g seconds_1MiB %g\n",
                    link_class_name(l), collective_name(k), cost.size(), cost[0].alpha_us,
                    cost[0].beta_gbps, collective_seconds(c, k, l, 1 << 20, 2));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_info: %s\n", e.what());
    return 1;
  }
  return 0;
}
