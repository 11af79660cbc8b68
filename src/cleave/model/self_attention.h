// Causal self-attention as a module of a block: y = out(attention(rope(qkv(x)))). Under tensor
// parallelism it holds the rank's heads: qkv is column-parallel and out row-parallel, so x is
// replicated (or gathered) on the tp ranks and y is a partial sum the block completes; the
// collectives between the regions are the block's, so that another attention (ring, Ulysses)
// is another module here with nothing else changed. Like the linears, it has forward,
// backward_input and backward_weight, and what one micro-batch keeps lives in a Saved the caller
// owns (docs/architecture.md, Modules).
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/base/buffer.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/rope.h"
#include "cleave/model/attention_core.h"
#include "cleave/model/kv_pool.h"
#include "cleave/model/layers.h"
#include "cleave/model/model_config.h"
#include "cleave/model/saved_bytes.h"
#include "cleave/model/spare_buffers.h"
#include "cleave/model/tp_share.h"

namespace cleave {

class SelfAttention {
 public:
  // One micro-batch's: what backward needs, and what its input half keeps for its weight half.
  struct Saved {
    int64_t B = 0, T = 0;
    const int32_t* positions = nullptr;  // the batch's, [B * T] (RoPE's backward)
    const int32_t* documents = nullptr;  // the batch's, or null: one document per sequence
    const int32_t* sequence_documents = nullptr;  // under cp: the whole sequences' (or null)
    std::unique_ptr<AttentionCore::Saved> core;   // the attention core's
    Buffer<float> qkv, o;        // projections (after RoPE), attention output
    OperandCopy x_copy, o_copy;  // bf16 copies of the linears' inputs (x's when kept)
    bool x_kept = false;
    Buffer<float> dy, d_qkv;     // kept by a deferred input half
    WeightGradInputs weight;     // for the weight half: the output and qkv gradients
    Buffer<float> cache_lse;     // inference: the paged attention's log-sum-exps
    void release();
  };
  // Shared by every block: the gradients inside one whole backward.
  struct Scratch {
    Buffer<float> d_o, d_qkv;
    OperandCopy dy_copy, dqkv_copy;
  };

  SelfAttention(ParamStore& store, const std::string& name, const ModelConfig& c,
                const TpShare& share, Precision precision, const kernels::RopeTable* rope,
                const ContextParallelOptions& cp = {});
  void bind(ParamStore& store);
  void reserve(Scratch& g, int64_t N) const;

  // y (=) for the batch's B sequences of T tokens, each token attending to the earlier tokens of
  // its document and rotated by its position; y holds the out projection without its bias
  // (add_bias, once the partial sums are complete). keep_x: keep x's bf16 copy for the weight
  // gradient (else x is given again, e.g. gathered again, and converted then). With a cache
  // (inference: a ragged batch, Batch::cached), the new tokens' keys and values go into their
  // sequences' blocks and each token attends to its sequence's keys there.
  void forward(Saved& s, float* y, const float* x, const Batch& batch, bool keep_x,
               const KvLayer* cache = nullptr);
  void add_bias(float* y, int64_t rows) const { out_.add_bias(y, rows); }
  // dx (=) from dy; defer keeps dy and the internal gradients in s for a later backward_weight
  // (else they live in g until this backward's backward_weight).
  void backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer);
  // The weight gradients (+=) of the micro-batch whose backward_input ran last on s; x as given to
  // forward.
  void backward_weight(Saved& s, const float* x);
  // Selective activation checkpointing: gives the qkv product's kept copy of its input x to
  // `spares` (take_spares gives one back), and makes it again from x.
  void release_input_copy(Saved& s, RecomputeSpares& spares) const {
    spares.copies.give(s.x_copy.data);
    s.x_copy.count = 0;
  }
  // Every buffer of s for N rows from the spares (a forward's), and all of them given back
  // (full recompute).
  void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const;
  void give_all(Saved& s, RecomputeSpares& spares) const;
  void recompute_input_copy(Saved& s, const float* x);
  // What forward keeps for N rows (keep_x as given to it), what release_input_copy frees, and
  // what a deferred input half keeps (model/saved_bytes.h).
  SavedBytes saved_bytes(int64_t N, bool keep_x) const;

 private:
  void rotate(Saved& s, const int32_t* positions);  // RoPE on q and k (Llama)
  void attend_cached(Saved& s, const Batch& batch, const KvLayer& cache);
  AttentionCore::Rows rows(const Saved& s) const {
    return {s.B, s.T, s.documents, s.sequence_documents};
  }

  const ModelConfig& cfg_;
  TpShare share_;
  const kernels::RopeTable* rope_;  // null for GPT-2
  Linear qkv_, out_;
  std::unique_ptr<AttentionCore> core_;  // local, or context-parallel where cp > 1
  std::vector<const int32_t*> tables_;   // attend_cached: the batch's block tables
};

}  // namespace cleave
