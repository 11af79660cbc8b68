// The decoder-only language model: embeddings, blocks, final norm, LM head and the fused
// cross-entropy loss. Forward keeps what backward needs; backward accumulates into the flat
// gradient buffer of params().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "cleave/model/block.h"
#include "cleave/model/model_config.h"

namespace cleave {

class Transformer {
 public:
  // pad_multiple: every unit of parameters (see n_units) starts at a multiple of it, and the flat
  // buffer's size is one (equal ZeRO shards of each unit). Every tensor is in group 0 ("dense").
  // materialise = false leaves the parameter values unset (ZeRO-3 builds only its shards).
  // tp: this rank's share of a tensor-parallel model (docs/tensor_parallel.md): its heads and
  // hidden units in every block, and its rows of the vocabulary in the embedding, the LM head and
  // the loss.
  Transformer(const ModelConfig& cfg, Precision precision, uint64_t seed, int64_t pad_multiple = 1,
              bool materialise = true, const TensorParallelOptions& tp = {});

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  // Whoever writes the values says so to params() (ParamStore::wrote and friends).
  ParamStore& params() { return store_; }

  // Units of parameters (ParamStore::begin_unit), in forward order: 0 the embeddings,
  // 1..n_layers the blocks, the last the final norm and LM head.
  int n_units() const { return cfg_.n_layers + 2; }

  // Called around the use of a unit's parameters, so data parallelism can gather them just in
  // time and start a unit's gradient communication as soon as backward has finished it. With
  // tied embeddings the head also uses unit 0 (announced inside the head's before/after pair,
  // and its gradients are final only after the embeddings' backward).
  struct UnitHooks {
    std::function<void(int unit)> before_forward, after_forward, before_backward, after_backward;
  };

  // Runs B sequences of T tokens; losses()[i] is the loss of token i (the same on every tp rank).
  // With grad_scale != 0 it prepares backward of grad_scale * sum(losses).
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               float grad_scale, const UnitHooks* hooks = nullptr);
  void backward(const UnitHooks* hooks = nullptr);
  const float* losses() const { return losses_.data(); }
  // Valid after a forward with grad_scale 0: [N, vocab] at tp = 1, else the rank's columns.
  const float* logits() const { return logits_.data(); }

  // Generation: caches for one sequence of up to max_pos positions; forward_cached appends T
  // tokens and returns the logits of the last one ([vocab_size]).
  std::vector<KVCache> new_cache(int64_t max_pos) const;
  const float* forward_cached(const int32_t* tokens, int64_t T, std::vector<KVCache>& cache);

  // For planning: what tp rank 0 of tp ranks holds, built without communication and without
  // touching the parameter buffers (mapped, never written). It cannot run.
  static std::unique_ptr<Transformer> planned(const ModelConfig& cfg, int tp, bool sequence_parallel);

  // Parameters that take part in matrix products (LM head included): the 6 * P of MFU.
  int64_t matmul_params() const;

 private:
  void reserve(int64_t B, int64_t T);
  void embed(float* out, const int32_t* tokens, int64_t B, int64_t T, int64_t pos0);
  int64_t local_rows(int64_t N) const { return tp_.sequence_parallel ? N / tp_.size() : N; }
  void loss(const int32_t* targets, int64_t N, float grad_scale);

  ModelConfig cfg_;
  Precision precision_;
  TensorParallelOptions tp_;
  TpShare share_;
  std::unique_ptr<TpComm> planned_group_;  // planned(): the group tp_ points to
  ParamStore store_;
  std::optional<kernels::RopeTable> rope_;
  int wte_, wpe_ = -1, head_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<LinearGemm> head_gemm_;
  BlockGrads grads_;

  int64_t B_ = 0, T_ = 0;
  const int32_t* tokens_ = nullptr;
  std::vector<Buffer<float>> resid_;  // n_layers + 1 residual streams [N, d]
  Buffer<float> hf_, d_hf_, logits_, losses_, d_resid_a_, d_resid_b_;
  Buffer<float> stats_, all_stats_;              // tp > 1
  Buffer<float> embed_full_, hf_full_, d_full_;  // sequence parallelism
};

}  // namespace cleave
