// One transformer block, pre-norm:
//   x_mid = x_in + out_proj(attention(rope(qkv(norm1(x_in)))))
//   x_out = x_mid + mlp_proj(act(mlp_fc(norm2(x_mid))))
// GPT-2: LayerNorm, biases, GELU. Llama: RMSNorm, RoPE, SwiGLU, no biases, GQA.
// The block keeps the activations of its latest forward (sized by reserve) for backward.
#pragma once
#include <cstdint>

#include "cleave/base/buffer.h"
#include "cleave/kernels/rope.h"
#include "cleave/model/layers.h"
#include "cleave/model/model_config.h"

namespace cleave {

// Key/value cache of one block for generation: [max_pos, n_kv_heads * head_dim] each.
struct KVCache {
  Buffer<float> k, v;
  int64_t length = 0;  // positions filled
};

// Gradients inside a block between backward_input and backward_weight. The model shares one
// scratch among blocks, so it calls backward_weight of a block before the next backward_input.
struct BlockGrads {
  Buffer<float> d_act, d_fc, d_h2, d_xmid, d_o, d_qkv, d_h1;
};

class Block {
 public:
  Block(ParamStore& store, int layer, const ModelConfig& cfg, Precision precision,
        const kernels::RopeTable* rope);
  void bind(ParamStore& store);
  void weights_changed();
  void release_packed();
  // Its linear layers' products, at the index of each one's weight tensor.
  void gemms_by_tensor(std::vector<LinearGemm*>& by_tensor);
  void reserve(int64_t B, int64_t T);
  static void reserve_grads(BlockGrads& g, const ModelConfig& cfg, int64_t N);

  // x_in must stay unchanged until backward_weight.
  void forward(float* x_out, const float* x_in, int64_t B, int64_t T);
  // Generation: one sequence of T new tokens following the cache's contents.
  void forward_cached(float* x_out, const float* x_in, int64_t T, KVCache& cache);
  // dx_in (=) from dx_out; leaves the intermediate gradients in g.
  void backward_input(float* dx_in, const float* dx_out, BlockGrads& g);
  void backward_weight(const float* dx_out, BlockGrads& g);

 private:
  void forward_impl(float* x_out, const float* x_in, int64_t B, int64_t T, KVCache* cache);

  const ModelConfig& cfg_;
  const kernels::RopeTable* rope_;  // null for GPT-2
  Norm norm1_, norm2_;
  Linear qkv_, out_, fc_, proj_;
  int64_t B_ = 0, T_ = 0;
  const float* x_in_ = nullptr;
  Buffer<float> h1_, qkv_act_, o_, lse_, x_mid_, h2_, fc_act_, act_;
};

}  // namespace cleave
