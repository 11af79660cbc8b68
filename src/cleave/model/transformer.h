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
  // pad_multiple: the flat parameter buffer is padded to a multiple of it (equal ZeRO shards).
  Transformer(const ModelConfig& cfg, Precision precision, uint64_t seed, int64_t pad_multiple = 1);

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  ParamStore& params() { return store_; }
  void weights_changed();  // after the values in params() were written

  // Runs B sequences of T tokens; losses()[i] is the loss of token i. With grad_scale != 0 it
  // prepares backward of grad_scale * sum(losses).
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               float grad_scale);
  // grads_ready(offset), when given, is called as backward proceeds: the gradients at flat offsets
  // >= offset are final for this micro-batch (parameters are laid out in forward order, and
  // backward runs from the head down to the embeddings), so their communication can start.
  void backward(const std::function<void(int64_t)>& grads_ready = {});
  const float* losses() const { return losses_.data(); }
  const float* logits() const { return logits_.data(); }  // valid after a forward with grad_scale 0

  // Generation: caches for one sequence of up to max_pos positions; forward_cached appends T
  // tokens and returns the logits of the last one ([vocab_size]).
  std::vector<KVCache> new_cache(int64_t max_pos) const;
  const float* forward_cached(const int32_t* tokens, int64_t T, std::vector<KVCache>& cache);

  // Parameters that take part in matrix products (LM head included): the 6 * P of MFU.
  int64_t matmul_params() const;

 private:
  void reserve(int64_t B, int64_t T);
  void embed(float* out, const int32_t* tokens, int64_t B, int64_t T, int64_t pos0);

  ModelConfig cfg_;
  Precision precision_;
  ParamStore store_;
  std::optional<kernels::RopeTable> rope_;
  int wte_, wpe_ = -1, head_;
  std::vector<int64_t> block_offsets_;  // flat offset of each block's first parameter
  int64_t final_norm_offset_ = 0;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<LinearGemm> head_gemm_;
  BlockGrads grads_;

  int64_t B_ = 0, T_ = 0;
  const int32_t* tokens_ = nullptr;
  std::vector<Buffer<float>> resid_;  // n_layers + 1 residual streams [N, d]
  Buffer<float> hf_, d_hf_, logits_, losses_, d_resid_a_, d_resid_b_;
};

}  // namespace cleave
