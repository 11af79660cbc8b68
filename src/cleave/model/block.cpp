#include "cleave/model/block.h"

#include <cmath>
#include <cstring>
#include <string>

#include "cleave/kernels/activation.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/attention_cached.h"

namespace cleave {

namespace {

std::string prefix(int layer) { return "blocks." + std::to_string(layer); }

// GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2L),
// so the stream's variance does not grow with depth.
float residual_std(const ModelConfig& c) { return c.init_std / std::sqrt(2.0f * c.n_layers); }

}  // namespace

Block::Block(ParamStore& store, int layer, const ModelConfig& c, Precision p,
             const kernels::RopeTable* rope)
    : cfg_(c), rope_(rope),
      norm1_(store, prefix(layer) + ".norm1", c.d_model, c.family == Family::gpt2, c.norm_eps),
      norm2_(store, prefix(layer) + ".norm2", c.d_model, c.family == Family::gpt2, c.norm_eps),
      qkv_(store, prefix(layer) + ".attn.qkv", c.d_model, c.qkv_dim(), c.family == Family::gpt2,
           c.init_std, p),
      out_(store, prefix(layer) + ".attn.out", c.n_heads * c.head_dim(), c.d_model,
           c.family == Family::gpt2, residual_std(c), p),
      fc_(store, prefix(layer) + ".mlp.fc", c.d_model, c.mlp_in_dim(), c.family == Family::gpt2,
          c.init_std, p),
      proj_(store, prefix(layer) + ".mlp.proj", c.ffn_hidden, c.d_model, c.family == Family::gpt2,
            residual_std(c), p) {}

void Block::bind(ParamStore& store) {
  norm1_.bind(store);
  norm2_.bind(store);
  qkv_.bind(store);
  out_.bind(store);
  fc_.bind(store);
  proj_.bind(store);
}

void Block::weights_changed() {
  qkv_.weights_changed();
  out_.weights_changed();
  fc_.weights_changed();
  proj_.weights_changed();
}

void Block::gemms_by_tensor(std::vector<LinearGemm*>& by_tensor) {
  for (Linear* l : {&qkv_, &out_, &fc_, &proj_}) by_tensor[size_t(l->weight_index())] = &l->gemm();
}

void Block::release_packed() {
  qkv_.release_packed();
  out_.release_packed();
  fc_.release_packed();
  proj_.release_packed();
}

void Block::reserve(int64_t B, int64_t T) {
  const int64_t N = B * T;
  if (N == B_ * T_ && B == B_) return;
  const int64_t d = cfg_.d_model;
  h1_.resize(N * d);
  qkv_act_.resize(N * cfg_.qkv_dim());
  o_.resize(N * cfg_.n_heads * cfg_.head_dim());
  lse_.resize(N * cfg_.n_heads);
  x_mid_.resize(N * d);
  h2_.resize(N * d);
  fc_act_.resize(N * cfg_.mlp_in_dim());
  act_.resize(N * cfg_.ffn_hidden);
  norm1_.reserve(N);
  norm2_.reserve(N);
  B_ = B, T_ = T;
}

void Block::reserve_grads(BlockGrads& g, const ModelConfig& c, int64_t N) {
  g.d_act.resize(N * c.ffn_hidden);
  g.d_fc.resize(N * c.mlp_in_dim());
  g.d_h2.resize(N * c.d_model);
  g.d_xmid.resize(N * c.d_model);
  g.d_o.resize(N * c.n_heads * c.head_dim());
  g.d_qkv.resize(N * c.qkv_dim());
  g.d_h1.resize(N * c.d_model);
}

void Block::forward(float* x_out, const float* x_in, int64_t B, int64_t T) {
  forward_impl(x_out, x_in, B, T, nullptr);
}

void Block::forward_cached(float* x_out, const float* x_in, int64_t T, KVCache& cache) {
  forward_impl(x_out, x_in, 1, T, &cache);
}

void Block::forward_impl(float* x_out, const float* x_in, int64_t B, int64_t T, KVCache* cache) {
  reserve(B, T);
  const int64_t N = B * T, d = cfg_.d_model, hd = cfg_.head_dim();
  const int64_t q_dim = int64_t(cfg_.n_heads) * hd, kv_dim = int64_t(cfg_.n_kv_heads) * hd;
  const int64_t qkv_dim = cfg_.qkv_dim();
  const int64_t pos0 = cache ? cache->length : 0;
  x_in_ = x_in;

  norm1_.forward(h1_.data(), x_in, N);
  qkv_.forward(qkv_act_.data(), h1_.data(), N);
  if (rope_) {  // q and k heads are adjacent at the start of each row: rotate them together
    kernels::rope_forward(qkv_act_.data(), *rope_, B, T, cfg_.n_heads + cfg_.n_kv_heads, qkv_dim,
                          pos0);
  }
  if (cache) {
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(cache->k.data() + (pos0 + t) * kv_dim, qkv_act_.data() + t * qkv_dim + q_dim,
                  kv_dim * sizeof(float));
      std::memcpy(cache->v.data() + (pos0 + t) * kv_dim,
                  qkv_act_.data() + t * qkv_dim + q_dim + kv_dim, kv_dim * sizeof(float));
    }
    kernels::attention_cached(o_.data(), qkv_act_.data(), qkv_dim, cache->k.data(),
                              cache->v.data(), T, pos0, cfg_.n_heads, cfg_.n_kv_heads, int(hd));
    cache->length += T;
  } else {
    const kernels::AttentionShape s{B, T, cfg_.n_heads, cfg_.n_kv_heads, int(hd), qkv_dim, qkv_dim};
    const float* q = qkv_act_.data();
    kernels::attention_forward(o_.data(), lse_.data(), q, q + q_dim, q + q_dim + kv_dim, s);
  }
  out_.forward(x_mid_.data(), o_.data(), N);
  kernels::add_inplace(x_mid_.data(), x_in, N * d);

  norm2_.forward(h2_.data(), x_mid_.data(), N);
  fc_.forward(fc_act_.data(), h2_.data(), N);
  if (cfg_.family == Family::gpt2)
    kernels::gelu_forward(act_.data(), fc_act_.data(), N * cfg_.ffn_hidden);
  else
    kernels::swiglu_forward(act_.data(), fc_act_.data(), N, cfg_.ffn_hidden);
  proj_.forward(x_out, act_.data(), N);
  kernels::add_inplace(x_out, x_mid_.data(), N * d);
}

void Block::backward_input(float* dx_in, const float* dx_out, BlockGrads& g) {
  const int64_t B = B_, T = T_, N = B * T, d = cfg_.d_model, hd = cfg_.head_dim();
  const int64_t q_dim = int64_t(cfg_.n_heads) * hd, kv_dim = int64_t(cfg_.n_kv_heads) * hd;
  const int64_t qkv_dim = cfg_.qkv_dim();

  proj_.backward_input(g.d_act.data(), dx_out, N, false);
  if (cfg_.family == Family::gpt2)
    kernels::gelu_backward(g.d_fc.data(), g.d_act.data(), fc_act_.data(), N * cfg_.ffn_hidden);
  else
    kernels::swiglu_backward(g.d_fc.data(), g.d_act.data(), fc_act_.data(), N, cfg_.ffn_hidden);
  fc_.backward_input(g.d_h2.data(), g.d_fc.data(), N, false);
  std::memcpy(g.d_xmid.data(), dx_out, N * d * sizeof(float));
  norm2_.backward_input(g.d_xmid.data(), g.d_h2.data(), x_mid_.data(), N);

  out_.backward_input(g.d_o.data(), g.d_xmid.data(), N, false);
  const kernels::AttentionShape s{B, T, cfg_.n_heads, cfg_.n_kv_heads, int(hd), qkv_dim, qkv_dim};
  const float* q = qkv_act_.data();
  float* dq = g.d_qkv.data();
  kernels::attention_backward(dq, dq + q_dim, dq + q_dim + kv_dim, g.d_o.data(), q, q + q_dim,
                              q + q_dim + kv_dim, o_.data(), lse_.data(), s);
  if (rope_)
    kernels::rope_backward(dq, *rope_, B, T, cfg_.n_heads + cfg_.n_kv_heads, qkv_dim, 0);
  qkv_.backward_input(g.d_h1.data(), g.d_qkv.data(), N, false);
  std::memcpy(dx_in, g.d_xmid.data(), N * d * sizeof(float));
  norm1_.backward_input(dx_in, g.d_h1.data(), x_in_, N);
}

void Block::backward_weight(const float* dx_out, BlockGrads& g) {
  const int64_t N = B_ * T_;
  proj_.backward_weight(dx_out, act_.data(), N);
  fc_.backward_weight(g.d_fc.data(), h2_.data(), N);
  norm2_.backward_weight(g.d_h2.data(), x_mid_.data(), N);
  out_.backward_weight(g.d_xmid.data(), o_.data(), N);
  qkv_.backward_weight(g.d_qkv.data(), h1_.data(), N);
  norm1_.backward_weight(g.d_h1.data(), x_in_, N);
}

}  // namespace cleave
