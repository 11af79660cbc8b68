// How `cleave calibrate` turns what it times into a cluster file's figures: the GEMM table from
// the passes of linear layers (kernels/gemm_bench.h, the timer `cleave bench-gemm` and `cleave
// peak` use), and each collective's alpha-beta from bench-comm's rows (comm/comm_bench.h).
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cleave/comm/comm_bench.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/plan/cluster.h"

namespace cleave {

// The linear shapes (tokens, in, out) to time: every one of tokens, in and out over `dims`. Their
// three passes then give every product of the grid dims x dims x dims three times (gemm_sample).
std::vector<std::tuple<int64_t, int, int>> calibration_shapes(const std::vector<int>& dims);

// A timed pass of a linear layer (y[N, out] = x[N, in] W^T) as the product C[m, n] = A[m, k] B[k, n]
// it computes: forward m = N, n = out, k = in; backward_input (dx = dy W) m = N, n = in, k = out;
// backward_weight (dW = dy^T x) m = out, n = in, k = N. Its time is the pass's median call on the
// wall clock (GemmBenchResult::seconds), every rank measuring at once: what a step's products
// take beside the host's other ranks (sharing its caches and memory), which the fastest call on
// CPU time (the GEMM peak's method) overstates by 5-20% here (docs/planner.md, Accuracy).
struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double seconds = 0;  // one call
  std::string pass;    // "fwd", "bwd_input", "bwd_weight"
};
GemmSample gemm_sample(const GemmBenchResult& r);

// The table of a dtype: each product's rate from the mean time of its samples, the passes a
// training step runs it as. Throws Error("WHERE: ...") unless the samples cover a full grid.
GemmTable gemm_table(const std::vector<GemmSample>& samples, const std::string& where);

// Each collective's cost (fit_collective) from bench_comm's rows of one group of `ranks` ranks
// (one dtype, one implementation per collective and size). Throws Error when a collective has
// fewer than two sizes.
LinkCosts fit_link(const std::vector<CommBenchRow>& rows, int ranks);

}  // namespace cleave
