// The model's shape, as the config's [model] table resolves it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

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

  int head_dim() const { return d_model / n_heads; }
  int qkv_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim(); }
  // The first linear of the MLP: GELU's input, or SwiGLU's gate and up projections side by side.
  int mlp_in_dim() const { return family == Family::llama ? 2 * ffn_hidden : ffn_hidden; }
  // GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2L),
  // so the stream's variance does not grow with depth.
  float residual_init_std() const { return init_std / std::sqrt(2.0f * n_layers); }
};

inline const char* family_name(Family f) { return f == Family::gpt2 ? "gpt2" : "llama"; }

}  // namespace cleave
