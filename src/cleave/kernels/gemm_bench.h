// Throughput of LinearGemm on given shapes: forward, backward_input and backward_weight are each
// warmed up, then timed repeatedly; the median time of a repetition gives GF/s (2*N*in*out flops
// per pass). Weights are prepacked (set_weight once, before the warm-up), as in training steps
// between optimizer updates. In bf16 mode forward and backward_input include converting their
// input to bf16, and backward_weight uses the copies they kept, as in a training step. Used by
// `cleave bench-gemm`.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "cleave/kernels/linear.h"

namespace cleave {

struct GemmBenchResult {
  int64_t N = 0;
  int in = 0, out = 0;
  std::string pass;  // "fwd", "bwd_input", "bwd_weight"
  Precision precision = Precision::fp32;
  double seconds = 0;  // median time of one call
  double gflops = 0;   // 2*N*in*out / seconds / 1e9
  double best_gflops = 0;  // of the fastest call, on CPU time where neighbours took the cores
  int repetitions = 0;
};

// Shapes are (N, in, out). Each pass of each shape gets about seconds_per_shape / 3 of timing
// (at least 3 repetitions) after 2 warm-up calls. Inputs are fixed pseudo-random values.
std::vector<GemmBenchResult> bench_linear_shapes(
    const std::vector<std::tuple<int64_t, int, int>>& shapes, Precision precision,
    double seconds_per_shape);

// The seconds a training step's own products take, from bench_linear_shapes' results of a dense
// model's shapes in gpt2_small_linear_shapes' order (the block's four linears, then the LM head):
// every pass of the block's linears n_layers times and the head's once, per micro-batch. The
// step's honest ceiling: the rest of the step is what it adds to this (docs/performance.md).
double step_product_seconds(const std::vector<GemmBenchResult>& results, int n_layers,
                            int microbatches);

// Packing W into both of its layouts (forward, backward_input), as after every optimizer step:
// pack_weight's one pass against oneDNN's reorder, once per layout. The weights rotate through
// copies that together exceed the last-level cache, so each is read cold, as in a training step.
struct PackBenchResult {
  int in = 0, out = 0;
  Precision precision = Precision::fp32;
  double cleave_seconds = 0, reorder_seconds = 0;  // median of one weight
};
std::vector<PackBenchResult> bench_weight_packing(
    const std::vector<std::tuple<int64_t, int, int>>& shapes, Precision precision,
    double seconds_per_shape);

// FLOP-weighted overall GF/s of a set of results: total flops / total median time, i.e. the
// throughput of running each listed (shape, pass) once.
double overall_gflops(const std::vector<GemmBenchResult>& results);

// The GEMM peak MFU is quoted against: the best rate of any pass of a fixed set of large shapes,
// each call timed on CPU time where the machine is shared, after warm-up, in rounds over the set
// until a round no longer beats the best by 1% (at least 3 rounds, at most about max_seconds).
// Every matrix product of a training step runs at most at this rate, and the rest of a step adds
// time, so a step's model FLOPs per second stay below it.
struct GemmPeak {
  double gflops = 0;
  int rounds = 0;
  double seconds = 0;  // spent measuring
};
GemmPeak measure_gemm_peak(Precision precision, double max_seconds);

// The linear-layer shapes of a GPT-2 124M training step with N tokens: qkv 768->2304, attention
// projection 768->768, MLP up 768->3072, MLP down 3072->768, LM head 768->vocab.
std::vector<std::tuple<int64_t, int, int>> gpt2_small_linear_shapes(int64_t N = 1024,
                                                                    int vocab = 8192);

}  // namespace cleave
