// The model's shape, as the config's [model] table resolves it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "cleave/kernels/moe_router.h"

namespace cleave {

enum class Family { gpt2, llama };


struct ModelConfig {
  Family family = Family::gpt2;
  int vocab_size = 8192;
  int d_model = 768;
  int n_layers = 12;
  int n_heads = 12;
  int n_kv_heads = 12;   // < n_heads: grouped-query attention (Llama family)
  int ffn_hidden = 3072;
  int max_seq_len = 1024;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_embeddings = true;
  float init_std = 0.02f;
  // Mixture of experts (0 experts: every layer dense). Layer l is MoE when l >= moe_first_dense
  // and l % moe_every == 0 (DeepSeek's first_k_dense_replace and moe_layer_freq). Each expert,
  // and the shared experts (one MLP of moe_shared_experts x moe_ffn_hidden units, DeepSeek's
  // fused form), is the family's MLP.
  int moe_experts = 0;
  int moe_top_k = 2;
  int moe_shared_experts = 0;
  int moe_ffn_hidden = 0;
  int moe_every = 1;
  int moe_first_dense = 0;
  MoeRouter moe_router = MoeRouter::topk_softmax;
  float moe_aux_loss_coef = 0.0f;      // Switch/GShard's N sum f_i P_i, per sequence
  float moe_z_loss_coef = 0.0f;        // the router's z-loss, mean over tokens
  float moe_bias_update_rate = 1e-3f;  // sigmoid_bias: the bias's step per optimizer step
  float moe_capacity_factor = 0.0f;    // 0: dropless; else each expert takes at most
                                       // ceil(factor x tokens x top_k / experts) of a sequence

  bool is_moe_layer(int layer) const {
    return moe_experts > 0 && layer >= moe_first_dense && layer % moe_every == 0;
  }
  int moe_layers() const {
    int n = 0;
    for (int l = 0; l < n_layers; ++l) n += is_moe_layer(l);
    return n;
  }

  int head_dim() const { return d_model / n_heads; }
  int qkv_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim(); }
  // The first linear of the MLP: GELU's input, or SwiGLU's gate and up projections side by side.
  int mlp_in_dim() const { return family == Family::llama ? 2 * ffn_hidden : ffn_hidden; }
  // GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2L),
  // so the stream's variance does not grow with depth.
  float residual_init_std() const { return init_std / std::sqrt(2.0f * n_layers); }
};

inline const char* family_name(Family f) { return f == Family::gpt2 ? "gpt2" : "llama"; }
inline const char* moe_router_name(MoeRouter r) {
  return r == MoeRouter::topk_softmax   ? "topk_softmax"
         : r == MoeRouter::softmax_topk ? "softmax_topk"
                                        : "sigmoid_bias";
}

}  // namespace cleave
