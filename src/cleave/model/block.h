// One transformer block, pre-norm, composed of modules:
//   x_mid = x_in + attention(norm1(x_in))
//   x_out = x_mid + mlp(norm2(x_mid))
// GPT-2: LayerNorm, biases, GELU. Llama: RMSNorm, RoPE, SwiGLU, no biases, GQA.
// The block owns the tensor-parallel collectives around its modules (docs/tensor_parallel.md):
// the attention's and the MLP's first linears are column-parallel and their last row-parallel, so
// a module's input enters every tp rank (replicated, or all-gathered under sequence parallelism)
// and its output, a partial sum, leaves by an all-reduce (or a reduce-scatter into the rank's
// rows). What one micro-batch keeps for its backward is a Saved the caller holds (the model's
// activation pool, one per unit and slot), so it can be freed and recomputed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cleave/base/batch.h"
#include "cleave/base/buffer.h"
#include "cleave/kernels/rope.h"
#include "cleave/model/feed_forward.h"
#include "cleave/model/layers.h"
#include "cleave/model/model_config.h"
#include "cleave/model/self_attention.h"
#include "cleave/model/spare_buffers.h"
#include "cleave/model/tp_share.h"

namespace cleave {

// Scratch shared among blocks (the model holds one): the gradients inside one backward.
// Full: every row; local: the rank's rows (the same under sequence parallelism off).
struct BlockGrads {
  SelfAttention::Scratch attn;
  FeedForwardScratch ffn;
  Buffer<float> d_h2, d_xmid, d_h1;
  // Sequence parallelism only. A column-parallel linear's input is gathered into `gathered` for
  // its forward and again for its weight gradient (as Megatron does), so no block keeps a full-row
  // copy; `partial` holds a row-parallel linear's sums before their reduce-scatter.
  Buffer<float> dy_full, d_xmid_full, d_h2_full, d_h1_full, gathered, partial;
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
// gradient (which keeps, in Saved, what the weight gradients need) and later the weight
// gradients.
enum class BackwardPart { both, input, weight };

class Block {
 public:
  // What one micro-batch's forward keeps for its backward, and what its input half keeps for
  // its weight half. Its input stays the caller's (x_in, unchanged until the backward).
  struct Saved {
    int64_t B = 0, T = 0;
    const float* x_in = nullptr;
    Buffer<float> h1, x_mid, h2;
    NormStats norm1, norm2;
    SelfAttention::Saved attn;
    std::unique_ptr<FeedForward::Saved> ffn;  // the block's feed-forward module's kind
    Buffer<float> d_h1, d_h2;  // BackwardPart::input only
    // Frees everything but the input: a forward on the same input rebuilds it, bitwise.
    void release();
  };

  // spares: the model's, which every block's forward and recompute take their buffers from and
  // activation checkpointing gives them back to. Its feed-forward module is make_feed_forward's
  // for the layer: the MLP, or a mixture of experts where cfg.is_moe_layer says so.
  Block(ParamStore& store, int layer, const ModelConfig& cfg, Precision precision,
        const kernels::RopeTable* rope, RecomputeSpares& spares,
        const TensorParallelOptions& tp = {}, const ContextParallelOptions& cp = {},
        const MoeOptions& moe = {});
  void bind(ParamStore& store);
  void reserve_grads(BlockGrads& g, int64_t N) const;

  // x_in and x_out hold the rank's rows of the batch's B sequences of T tokens (all of them, or
  // 1/tp under sequence parallelism). x_in and the batch must stay unchanged until the backward
  // of s. With a cache (inference: the layer's blocks of a key/value pool), the batch is a ragged
  // one of new tokens following their sequences' cached ones (Batch::cached). A MoE layer takes
  // the loss's grad_scale for its balancing terms' gradients and, with count_stats, adds the
  // micro-batch to its routing statistics.
  void forward(Saved& s, float* x_out, const float* x_in, const Batch& batch, BlockGrads& g,
               const KvLayer* cache = nullptr, float grad_scale = 0, bool count_stats = false);
  Moe* moe() { return ffn_->moe(); }  // null in a dense layer
  // dx_in (=) from dx_out, and the weight gradients (+=), of s's micro-batch. With both, each
  // column-parallel linear's input gradient is reduced over tp while its and its row-parallel
  // partner's weight gradients run. part weight ignores dx_in and dx_out.
  void backward(Saved& s, float* dx_in, const float* dx_out, BlockGrads& g,
                BackwardPart part = BackwardPart::both);
  // Selective activation checkpointing: gives what s holds that is cheap to rebuild (the norms'
  // outputs, the MLP's activation, the bf16 copies of them the products keep) to the spares,
  // keeping every product's output; recompute_cheap rebuilds it, bitwise, with no product and no
  // collective. Full: release_all gives every buffer, and a forward on the same input rebuilds
  // them.
  void release_recomputable(Saved& s) const;
  void release_all(Saved& s) const;
  void recompute_cheap(Saved& s);
  // What a forward of N rows keeps in Saved (model/saved_bytes.h): kept by selective
  // checkpointing, rebuilt by recompute_cheap, and kept by a deferred input half.
  SavedBytes saved_bytes(int64_t N) const;

 private:
  void weight_gradients(Saved& s, BlockGrads& g);
  int64_t local_rows(int64_t N) const { return tp_.sequence_parallel ? N / tp_.size() : N; }
  // The input of a column-parallel linear: the norm's output, gathered from every rank's rows
  // under sequence parallelism (into full).
  const float* enter_column(const float* local, float* full, int64_t N, const char* what);
  // A row-parallel linear's partial sums `partial` [N, d] become the rank's rows of the sum in
  // out (in place when they are the same buffer, without sequence parallelism).
  void leave_row(float* partial, float* out, int64_t N);

  const ModelConfig& cfg_;
  TensorParallelOptions tp_;
  TpShare share_;
  std::string name_;
  void take_spares(Saved& s, int64_t N) const;  // s's buffers sized for N rows
  RecomputeSpares& spares_;
  Norm norm1_, norm2_;
  SelfAttention attn_;
  std::unique_ptr<FeedForward> ffn_;
};

}  // namespace cleave
