#include "cleave/model/transformer.h"

#include <algorithm>
#include <cstring>

#include "cleave/kernels/cross_entropy.h"
#include "cleave/kernels/embedding.h"

namespace cleave {

Transformer::Transformer(const ModelConfig& c, Precision precision, uint64_t seed,
                         int64_t pad_multiple, bool materialise)
    : cfg_(c), precision_(precision) {
  wte_ = store_.add("embed.wte", {c.vocab_size, c.d_model}, Init::normal, c.init_std);
  if (c.family == Family::gpt2)
    wpe_ = store_.add("embed.wpe", {c.max_seq_len, c.d_model}, Init::normal, c.init_std);
  else
    rope_.emplace(c.head_dim(), c.max_seq_len, c.rope_theta);
  // Units (embeddings, each block, the head) start at multiples of pad_multiple, so each can be
  // sharded in equal parts.
  unit_bounds_.push_back(0);
  for (int l = 0; l < c.n_layers; ++l) {
    store_.align(pad_multiple);
    unit_bounds_.push_back(store_.total());
    blocks_.push_back(
        std::make_unique<Block>(store_, l, cfg_, precision, rope_ ? &*rope_ : nullptr));
  }
  store_.align(pad_multiple);
  unit_bounds_.push_back(store_.total());
  final_norm_ = std::make_unique<Norm>(store_, "final_norm", c.d_model, c.family == Family::gpt2,
                                       c.norm_eps);
  head_ = c.tie_embeddings
              ? wte_
              : store_.add("lm_head.weight", {c.vocab_size, c.d_model}, Init::normal, c.init_std);
  head_gemm_ = std::make_unique<LinearGemm>(c.d_model, c.vocab_size, precision);
  store_.align(pad_multiple);
  unit_bounds_.push_back(store_.total());

  store_.allocate(seed, 1, materialise);
  for (auto& b : blocks_) b->bind(store_);
  final_norm_->bind(store_);
  head_gemm_->set_weight(store_.value(head_));
  gemm_of_tensor_.assign(store_.tensors().size(), nullptr);
  for (auto& b : blocks_) b->gemms_by_tensor(gemm_of_tensor_);
  gemm_of_tensor_[size_t(head_)] = head_gemm_.get();
}

void Transformer::weights_changed() {
  for (auto& b : blocks_) b->weights_changed();
  head_gemm_->set_weight(store_.value(head_));
}

int64_t Transformer::begin_row_packing(int tensor) {
  LinearGemm* gemm = gemm_of_tensor_[size_t(tensor)];
  const int64_t rows = gemm ? gemm->begin_row_packing() : 0;
  if (rows > 0) row_packing_.push_back(gemm);
  return rows;
}

void Transformer::pack_rows(int tensor, int64_t row0, int64_t row1) {
  gemm_of_tensor_[size_t(tensor)]->pack_rows(row0, row1);
}

void Transformer::all_rows_packed() {
  for (LinearGemm* gemm : row_packing_) gemm->all_rows_packed();
  row_packing_.clear();
}

void Transformer::reserve(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  const int64_t N = B * T, d = cfg_.d_model;
  resid_.resize(cfg_.n_layers + 1);
  for (auto& r : resid_) r.resize(N * d);
  hf_.resize(N * d);
  d_hf_.resize(N * d);
  logits_.resize(N * cfg_.vocab_size);
  losses_.resize(N);
  d_resid_a_.resize(N * d);
  d_resid_b_.resize(N * d);
  Block::reserve_grads(grads_, cfg_, N);
  B_ = B, T_ = T;
}

void Transformer::embed(float* out, const int32_t* tokens, int64_t B, int64_t T, int64_t pos0) {
  kernels::embedding_forward(out, tokens, store_.value(wte_), wpe_ >= 0 ? store_.value(wpe_) : nullptr,
                             B, T, cfg_.d_model, pos0);
}

void Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale, const UnitHooks* hooks) {
  CLEAVE_CHECK(T <= cfg_.max_seq_len, "sequence of " << T << " tokens exceeds max_seq_len "
                                                     << cfg_.max_seq_len);
  reserve(B, T);
  const int64_t N = B * T;
  const int head = n_units() - 1;
  auto call = [&](const std::function<void(int)>& hook, int unit) {
    if (hooks && hook) hook(unit);
  };
  tokens_ = tokens;
  call(hooks ? hooks->before_forward : nullptr, 0);
  embed(resid_[0].data(), tokens, B, T, 0);
  call(hooks ? hooks->after_forward : nullptr, 0);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    call(hooks ? hooks->before_forward : nullptr, l + 1);
    blocks_[l]->forward(resid_[l + 1].data(), resid_[l].data(), B, T);
    call(hooks ? hooks->after_forward : nullptr, l + 1);
  }
  call(hooks ? hooks->before_forward : nullptr, head);
  if (cfg_.tie_embeddings) call(hooks ? hooks->before_forward : nullptr, 0);
  final_norm_->forward(hf_.data(), resid_[cfg_.n_layers].data(), N);
  head_gemm_->forward(logits_.data(), hf_.data(), N, nullptr);
  kernels::cross_entropy_forward_backward(logits_.data(), losses_.data(), targets, N,
                                          cfg_.vocab_size, grad_scale);
  if (cfg_.tie_embeddings) call(hooks ? hooks->after_forward : nullptr, 0);
  call(hooks ? hooks->after_forward : nullptr, head);
}

void Transformer::backward(const UnitHooks* hooks) {
  const int64_t N = B_ * T_;
  const int head = n_units() - 1;
  auto call = [&](const std::function<void(int)>& hook, int unit) {
    if (hooks && hook) hook(unit);
  };
  // logits_ holds dlogits now (the loss kernel overwrote it).
  float* d_out = d_resid_a_.data();
  float* d_in = d_resid_b_.data();
  call(hooks ? hooks->before_backward : nullptr, head);
  if (cfg_.tie_embeddings) call(hooks ? hooks->before_backward : nullptr, 0);
  head_gemm_->backward_input(d_hf_.data(), logits_.data(), N, false);
  head_gemm_->backward_weight(store_.grad(head_), nullptr, logits_.data(), hf_.data(), N);
  std::memset(d_out, 0, N * cfg_.d_model * sizeof(float));
  final_norm_->backward_input(d_out, d_hf_.data(), resid_[cfg_.n_layers].data(), N);
  final_norm_->backward_weight(d_hf_.data(), resid_[cfg_.n_layers].data(), N);
  call(hooks ? hooks->after_backward : nullptr, head);
  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    call(hooks ? hooks->before_backward : nullptr, l + 1);
    blocks_[l]->backward_input(d_in, d_out, grads_);
    blocks_[l]->backward_weight(d_out, grads_);
    call(hooks ? hooks->after_backward : nullptr, l + 1);
    std::swap(d_in, d_out);
  }
  if (!cfg_.tie_embeddings) call(hooks ? hooks->before_backward : nullptr, 0);
  kernels::embedding_backward(store_.grad(wte_), wpe_ >= 0 ? store_.grad(wpe_) : nullptr, d_out,
                              tokens_, B_, T_, cfg_.d_model);
  call(hooks ? hooks->after_backward : nullptr, 0);
}

void Transformer::release_unit_packed(int unit) {
  if (unit >= 1 && unit <= cfg_.n_layers) blocks_[unit - 1]->release_packed();
  // The head's product uses wte when the embeddings are tied.
  const int head_unit = cfg_.tie_embeddings ? 0 : n_units() - 1;
  if (unit == head_unit) head_gemm_->release_packed();
}

std::vector<KVCache> Transformer::new_cache(int64_t max_pos) const {
  std::vector<KVCache> cache(cfg_.n_layers);
  const int64_t kv_dim = int64_t(cfg_.n_kv_heads) * cfg_.head_dim();
  for (auto& c : cache) {
    c.k.resize(max_pos * kv_dim);
    c.v.resize(max_pos * kv_dim);
  }
  return cache;
}

const float* Transformer::forward_cached(const int32_t* tokens, int64_t T,
                                         std::vector<KVCache>& cache) {
  const int64_t pos0 = cache.at(0).length;
  CLEAVE_CHECK(pos0 + T <= cfg_.max_seq_len && pos0 + T <= cache[0].k.size() / (cfg_.n_kv_heads * cfg_.head_dim()),
               "generation of " << pos0 + T << " positions exceeds the cache or max_seq_len "
                                << cfg_.max_seq_len);
  reserve(1, T);
  const int64_t d = cfg_.d_model;
  embed(resid_[0].data(), tokens, 1, T, pos0);
  for (int l = 0; l < cfg_.n_layers; ++l)
    blocks_[l]->forward_cached(resid_[l + 1].data(), resid_[l].data(), T, cache[l]);
  const float* last = resid_[cfg_.n_layers].data() + (T - 1) * d;
  final_norm_->forward(hf_.data(), last, 1);
  head_gemm_->forward(logits_.data(), hf_.data(), 1, nullptr);
  return logits_.data();
}

int64_t Transformer::matmul_params() const {
  const ModelConfig& c = cfg_;
  const int64_t per_block = int64_t(c.d_model) * c.qkv_dim() +
                            int64_t(c.n_heads) * c.head_dim() * c.d_model +
                            int64_t(c.d_model) * c.mlp_in_dim() + int64_t(c.ffn_hidden) * c.d_model;
  return per_block * c.n_layers + int64_t(c.vocab_size) * c.d_model;
}

}  // namespace cleave
