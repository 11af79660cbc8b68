// One transformer block, pre-norm:
//   x_mid = x_in + out_proj(attention(rope(qkv(norm1(x_in)))))
//   x_out = x_mid + mlp_proj(act(mlp_fc(norm2(x_mid))))
// GPT-2: LayerNorm, biases, GELU. Llama: RMSNorm, RoPE, SwiGLU, no biases, GQA.
// The block keeps what backward needs in activation slots, one per micro-batch in flight (the
// pipeline schedule says how many and which: forward and backward name the slot).
// Under tensor parallelism (docs/tensor_parallel.md) qkv and mlp.fc are column-parallel and
// attn.out and mlp.proj row-parallel: each tp rank holds its heads and hidden units, and one
// all-reduce each way joins each half of the block. Under sequence parallelism the residual
// stream, the norms and the adds hold the rank's 1/tp of the rows, an all-gather enters each
// column-parallel linear and a reduce-scatter leaves each row-parallel one.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/kernels/rope.h"
#include "cleave/model/layers.h"
#include "cleave/model/model_config.h"
#include "cleave/model/tensor_parallel.h"

namespace cleave {

// Key/value cache of one block for generation: [max_pos, n_kv_heads * head_dim] each.
struct KVCache {
  Buffer<float> k, v;
  int64_t length = 0;  // positions filled
};

// Scratch shared among blocks (the model holds one). Full: every row; local: the rank's rows
// (the same under sequence parallelism off).
struct BlockGrads {
  Buffer<float> d_act, d_fc, d_h2, d_xmid, d_o, d_qkv, d_h1;
  // Sequence parallelism only. A column-parallel linear's input is gathered into `gathered` for
  // its forward and again for its weight gradient (as Megatron does), so no block keeps a full-row
  // copy; `partial` holds a row-parallel linear's sums before their reduce-scatter.
  Buffer<float> dy_full, d_xmid_full, d_h2_full, d_h1_full, gathered, partial;
  // bf16 copies of the linears' output gradients, from their backward_input to their weight
  // gradient within one whole backward.
  OperandCopy proj_dy, fc_dy, out_dy, qkv_dy;
  // The residual stream's gradient, gathered into dy_full ahead of the block that needs it (by
  // the block or head before, under its weight gradients): from `dy_source`, done at dy_gathered.
  const float* dy_source = nullptr;
  TpComm::Wait dy_gathered;
};

// Sequence parallelism: starts gathering the rank's rows `local` of the residual stream's
// gradient (n floats) into g.dy_full for the next block; gathered_rows returns them gathered,
// waiting for that gather when it was started for `local`, or gathering now.
void start_gather_rows(TpComm& comm, BlockGrads& g, const float* local, int64_t n);
const float* gathered_rows(TpComm& comm, BlockGrads& g, const float* local, int64_t n);

// Backward in one call, or in the two halves zero-bubble schedules run apart: the input
// gradient (which keeps, in the slot, what the weight gradients need) and later the weight
// gradients.
enum class BackwardPart { both, input, weight };

class Block {
 public:
  Block(ParamStore& store, int layer, const ModelConfig& cfg, Precision precision,
        const kernels::RopeTable* rope, const TensorParallelOptions& tp = {});
  void bind(ParamStore& store);
  void share_scratch(BlockGrads* g) { shared_ = g; }  // needed under sequence parallelism
  void set_slots(int n) { slots_.resize(size_t(n)); }
  void reserve_grads(BlockGrads& g, int64_t N) const;

  // x_in and x_out hold the rank's rows of B sequences of T tokens (all of them, or 1/tp under
  // sequence parallelism). x_in must stay unchanged until the slot's backward.
  void forward(int slot, float* x_out, const float* x_in, int64_t B, int64_t T);
  // Generation (tp = 1, slot 0): one sequence of T new tokens following the cache's contents.
  void forward_cached(float* x_out, const float* x_in, int64_t T, KVCache& cache);
  // dx_in (=) from dx_out, and the weight gradients (+=), of the slot's micro-batch. With both,
  // each column-parallel linear's input gradient is reduced over tp while its and its
  // row-parallel partner's weight gradients run. part weight ignores dx_in and dx_out.
  void backward(int slot, float* dx_in, const float* dx_out, BlockGrads& g,
                BackwardPart part = BackwardPart::both);

 private:
  // What one micro-batch's forward keeps for its backward, and what its input-gradient half
  // keeps for the weight-gradient half.
  struct Slot {
    int64_t B = 0, T = 0;
    const float* x_in = nullptr;
    Buffer<float> h1, qkv_act, o, lse, x_mid, h2, fc_act, act;
    NormStats norm1, norm2;
    // bf16 copies of the linears' inputs for their weight gradients (bf16 mode). Under sequence
    // parallelism qkv's and fc's inputs are gathered again instead, and converted then.
    OperandCopy qkv_x, out_x, fc_x, proj_x;
    Buffer<float> dy, d_fc, d_xmid, d_qkv, d_h1, d_h2;  // BackwardPart::input only
  };
  void reserve(Slot& s, int64_t B, int64_t T);
  void reserve_deferred(Slot& s);
  void forward_impl(Slot& s, float* x_out, const float* x_in, int64_t B, int64_t T,
                    KVCache* cache);
  void weight_gradients(Slot& s, BlockGrads& g);
  int64_t local_rows(int64_t N) const { return tp_.sequence_parallel ? N / tp_.size() : N; }
  // The input of a column-parallel linear: the norm's output, gathered from every rank's rows
  // under sequence parallelism (into full).
  const float* enter_column(const float* local, float* full, int64_t N, const char* what);
  // A row-parallel linear's partial sums `partial` [N, d] become the rank's rows of the sum in
  // out (in place when they are the same buffer, without sequence parallelism).
  void leave_row(float* partial, float* out, int64_t N);

  const ModelConfig& cfg_;
  const kernels::RopeTable* rope_;  // null for GPT-2
  TensorParallelOptions tp_;
  TpShare share_;
  std::string name_;
  Norm norm1_, norm2_;
  Linear qkv_, out_, fc_, proj_;
  std::vector<Slot> slots_ = std::vector<Slot>(1);
  BlockGrads* shared_ = nullptr;
};

}  // namespace cleave
