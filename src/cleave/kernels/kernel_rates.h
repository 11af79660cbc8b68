// The time a training step's kernels other than the linears' products take on this CPU, measured
// by running them (for `cleave calibrate`, plan/cluster.h): a transformer block's element-wise
// kernels, causal attention, and the packing of a weight into its products' layouts as the
// optimizer does it after each update. The planner turns these into its rates; the inputs are
// fixed pseudo-random values, every buffer touched before the timing starts.
#pragma once
#include <cstdint>

#include "cleave/kernels/fp8.h"
#include "cleave/kernels/linear.h"

namespace cleave {

// One block's element-wise kernels over `tokens` rows, as the trainer's block calls them:
// GPT-2 (swiglu false): two layer norms, two residual adds and GELU over the hidden units each
// way, and the norms' weight gradients backward; Llama (swiglu true): RMS norms, SwiGLU over the
// fused gate and up columns, and RoPE on the queries and keys (n_heads of head_dim 64) in place
// of GELU's neighbours.
struct BlockKernels {
  int64_t tokens = 0;
  int d_model = 0, hidden = 0;
  bool swiglu = false;
};
struct PassSeconds {
  double forward = 0, backward = 0;  // median of one pass
};
PassSeconds time_block_elementwise(const BlockKernels& block, double budget);

// Causal self-attention of one sequence of `tokens` over `heads` heads of `head_dim`, read from
// a fused qkv buffer as a block holds it: the median forward and backward (kernels/attention.h).
PassSeconds time_attention(int64_t tokens, int heads, int head_dim, double budget);

// Packing a weight of [out, in] into the layouts its products on N rows take, band by band as
// an optimizer step packs it while it writes W (LinearGemm::begin_row_packing), into copies the
// caches do not hold (a step packs the whole model): the median seconds of one weight, and the
// bytes of the copies it writes (LinearGemm::weight_copy_bytes).
struct PackTiming {
  double seconds = 0;
  double copy_bytes = 0;
};
PackTiming time_weight_packing(int64_t N, int in, int out, Precision precision, double budget);

// FP8's own kernels in one linear's passes (kernels/linear_fp8.h: amaxes, quantisation, bf16
// images, scaled sums), timed as what an FP8 linear of [out, in] on N rows takes beyond a bf16
// one: forward, backward_input and backward_weight, each pass after a new version of W (so with
// W's images, as a step's first pass makes them). `bytes` are fp8_traffic's for those passes,
// `seconds` the median extra of an FP8 pass over a bf16 one run just before it (noise can make
// it zero or less).
struct Fp8Timing {
  double bytes = 0, seconds = 0;
};
Fp8Timing time_fp8_kernels(int64_t N, int in, int out, kernels::Fp8Recipe recipe, double budget);

// Writing ranges of range_bytes of a buffer of buffer_bytes again after release_range returned
// their pages (as ZeRO-2/3 write each unit's gradients or gathered parameters every step), against
// writing them resident: the median seconds of each pass over all the ranges, and its bytes. The
// ranges start off a page boundary, as a model's units do; a buffer of kHugePageBufferBytes and
// more has huge pages, which the first releases split.
struct RefaultTiming {
  double bytes = 0, resident_seconds = 0, released_seconds = 0;
};
RefaultTiming time_refaults(int64_t buffer_bytes, int64_t range_bytes, double budget);

}  // namespace cleave
