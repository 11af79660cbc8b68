// How calibrate turns timings into a cluster's figures: each pass of a linear layer is the product
// it computes, the shapes' passes cover the grid, a product's rate comes from the mean of its
// passes' times, and bench-comm's rows become each collective's cost.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cleave/base/check.h"
#include "cleave/plan/calibration.h"

namespace cleave {
namespace {

GemmBenchResult pass(int64_t N, int in, int out, const char* name, double seconds) {
  GemmBenchResult r;
  r.N = N, r.in = in, r.out = out, r.pass = name;
  r.seconds = seconds;  // the median call on the wall clock
  r.gflops = 2.0 * double(N) * in * out / seconds * 1e-9;
  r.best_gflops = 2 * r.gflops;  // the fastest on CPU time: not what the table takes
  return r;
}

TEST(Calibration, EachPassIsTheProductItComputes) {
  // y[N, out] = x[N, in] W^T: m = N, n = out, k = in.
  GemmSample s = gemm_sample(pass(8, 3, 5, "fwd", 1e-3));
  EXPECT_EQ(std::make_tuple(s.m, s.n, s.k), std::make_tuple(int64_t(8), int64_t(5), int64_t(3)));
  EXPECT_NEAR(s.seconds, 1e-3, 1e-15);  // the median call's time
  // dx[N, in] = dy[N, out] W: m = N, n = in, k = out.
  s = gemm_sample(pass(8, 3, 5, "bwd_input", 1e-3));
  EXPECT_EQ(std::make_tuple(s.m, s.n, s.k), std::make_tuple(int64_t(8), int64_t(3), int64_t(5)));
  // dW[out, in] = dy^T[out, N] x[N, in]: m = out, n = in, k = N.
  s = gemm_sample(pass(8, 3, 5, "bwd_weight", 1e-3));
  EXPECT_EQ(std::make_tuple(s.m, s.n, s.k), std::make_tuple(int64_t(5), int64_t(3), int64_t(8)));
  EXPECT_THROW(gemm_sample(pass(8, 3, 5, "sideways", 1e-3)), Error);
}

TEST(Calibration, TheShapesPassesCoverTheGridThreeTimes) {
  const std::vector<int> dims = {16, 64, 256};
  std::vector<GemmSample> samples;
  for (const auto& [N, in, out] : calibration_shapes(dims))
    for (const char* name : {"fwd", "bwd_input", "bwd_weight"})
      samples.push_back(gemm_sample(pass(N, in, out, name, 1e-9 * double(N) * in * out)));
  EXPECT_EQ(samples.size(), 81u);
  const GemmTable table = gemm_table(samples, "test");
  ASSERT_EQ(table.points().size(), 27u);
  for (const GemmPoint& p : table.points()) EXPECT_NEAR(p.gflops, 2.0, 1e-9);
  // A product's rate comes from the mean of its passes' times: 1 ms and 3 ms make 2 ms.
  const GemmTable mean =
      gemm_table({{4, 4, 4, 1e-3, "fwd"}, {4, 4, 4, 3e-3, "bwd_input"}}, "test");
  EXPECT_NEAR(mean.points()[0].gflops, 128 / 2e-3 * 1e-9, 1e-15);
  // A pass fewer leaves every product measured; a product missing leaves no grid.
  samples.pop_back();
  EXPECT_NO_THROW(gemm_table(samples, "test"));
  EXPECT_THROW(gemm_table({{4, 4, 4, 1e-3, "fwd"}, {8, 8, 4, 1e-3, "fwd"}}, "test"), Error);
}

TEST(Calibration, BenchRowsBecomeEachCollectivesCost) {
  std::vector<CommBenchRow> rows;
  for (Collective kind : kCollectives)
    for (int64_t bytes = 4096; bytes <= (1 << 20); bytes *= 4) {
      CommBenchRow r{};
      r.op = collective_name(kind);
      r.bytes = bytes;
      // 5 us per step, 2 GB/s per rank, 4 ranks.
      r.seconds = 5e-6 * ring_steps(kind, 4) + ring_bytes_sent(kind, double(bytes), 4) / 2e9;
      rows.push_back(r);
    }
  const LinkCosts costs = fit_link(rows, 4);
  for (Collective kind : kCollectives) {
    ASSERT_EQ(costs[size_t(kind)].size(), 1u) << collective_name(kind);
    EXPECT_NEAR(costs[size_t(kind)][0].alpha_us, 5, 1e-9) << collective_name(kind);
    EXPECT_NEAR(costs[size_t(kind)][0].beta_gbps, 2, 1e-9) << collective_name(kind);
  }
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [](const CommBenchRow& r) { return r.op == "send_recv"; }),
             rows.end());
  EXPECT_THROW(fit_link(rows, 4), Error);  // a collective not measured
}

}  // namespace
}  // namespace cleave
