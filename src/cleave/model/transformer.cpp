#include "cleave/model/transformer.h"

#include <algorithm>
#include <cstring>

#include "cleave/kernels/cross_entropy.h"
#include "cleave/kernels/embedding.h"
#include "cleave/model/tp_pairs.h"

namespace cleave {

namespace {

// The rank's rows of a [vocab, d] tensor: padded to ceil(vocab / tp) rows, the padding in no
// global row.
Placement vocab_placement(const ModelConfig& c, const TpShare& s) {
  if (s.tp == 1) return {};
  std::vector<Segment> rows;
  if (s.vocab_real > 0) rows.push_back({0, s.vocab_begin, s.vocab_real, GradSum::none});
  return shard_rows({c.vocab_size, c.d_model}, std::move(rows));
}

}  // namespace

Transformer::Transformer(const ModelConfig& c, Precision precision, uint64_t seed,
                         int64_t pad_multiple, bool materialise, const TensorParallelOptions& tp)
    : cfg_(c), precision_(precision), tp_(tp), share_(tp_share(c, tp.size(), tp.rank())) {
  const GradSum sp_sum = tp.sequence_parallel ? GradSum::tp : GradSum::none;
  store_.begin_unit();
  wte_ = store_.add("embed.wte", {share_.vocab_rows, c.d_model}, Init::normal, c.init_std,
                    vocab_placement(c, share_));
  if (c.family == Family::gpt2)
    wpe_ = store_.add("embed.wpe", {c.max_seq_len, c.d_model}, Init::normal, c.init_std,
                      {{}, -1, {}, sp_sum});
  else
    rope_.emplace(c.head_dim(), c.max_seq_len, c.rope_theta);
  // Units (embeddings, each block, the head) start at multiples of pad_multiple, so each can be
  // sharded in equal parts.
  for (int l = 0; l < c.n_layers; ++l) {
    store_.begin_unit();
    blocks_.push_back(
        std::make_unique<Block>(store_, l, cfg_, precision, rope_ ? &*rope_ : nullptr, tp));
  }
  store_.begin_unit();
  final_norm_ = std::make_unique<Norm>(store_, "final_norm", c.d_model, c.family == Family::gpt2,
                                       c.norm_eps, sp_sum);
  head_ = c.tie_embeddings ? wte_
                           : store_.add("lm_head.weight", {share_.vocab_rows, c.d_model},
                                        Init::normal, c.init_std, vocab_placement(c, share_));
  head_gemm_ = std::make_unique<LinearGemm>(c.d_model, int(share_.vocab_rows), precision);

  store_.allocate(seed, pad_multiple, materialise);
  for (auto& b : blocks_) {
    b->bind(store_);
    b->share_scratch(&grads_);
  }
  final_norm_->bind(store_);
  store_.keep_packed(head_, head_gemm_.get());
}

void Transformer::reserve(int64_t B, int64_t T) {
  if (B == B_ && T == T_) return;
  const int64_t N = B * T, n = local_rows(N), d = cfg_.d_model;
  resid_.resize(cfg_.n_layers + 1);
  for (auto& r : resid_) r.resize(n * d);
  hf_.resize(n * d);
  d_hf_.resize(N * d);
  logits_.resize(N * share_.vocab_rows);
  losses_.resize(N);
  d_resid_a_.resize(n * d);
  d_resid_b_.resize(n * d);
  if (tp_.comm) {
    stats_.resize(3 * N);
    all_stats_.resize(3 * N * tp_.size());
  }
  if (tp_.sequence_parallel) {
    embed_full_.resize(N * d);
    hf_full_.resize(N * d);
    d_full_.resize(N * d);
  }
  blocks_.front()->reserve_grads(grads_, N);
  B_ = B, T_ = T;
}

void Transformer::embed(float* out, const int32_t* tokens, int64_t B, int64_t T, int64_t pos0) {
  if (!tp_.comm) {
    kernels::embedding_forward(out, tokens, store_.value(wte_),
                               wpe_ >= 0 ? store_.value(wpe_) : nullptr, B, T, cfg_.d_model, pos0);
    return;
  }
  // Vocabulary-parallel: each rank looks up the tokens it holds (0 for the others) and the tp
  // sum completes the lookup (a row-parallel output: all-reduce, or reduce-scatter into the
  // rank's rows). Positions are added after the sum, to the rank's rows.
  const int64_t N = B * T, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  kernels::embedding_lookup_shard(sp ? embed_full_.data() : out, tokens, store_.value(wte_), N,
                                  int(d), share_.vocab_begin, share_.vocab_real);
  if (sp) tp_pairs::scatter_forward(*tp_.comm, embed_full_.data(), out, n * d)();
  else tp_pairs::reduce_forward(*tp_.comm, out, N * d)();
  if (wpe_ >= 0)
    kernels::position_add(out, store_.value(wpe_), n, tp_.sequence_parallel ? tp_.rank() * n : 0,
                          T, int(d));
}

void Transformer::loss(const int32_t* targets, int64_t N, float grad_scale) {
  if (!tp_.comm) {
    kernels::cross_entropy_forward_backward(logits_.data(), losses_.data(), targets, N,
                                            cfg_.vocab_size, grad_scale);
    return;
  }
  vocab_parallel_cross_entropy(tp_, share_, cfg_.vocab_size, logits_.data(), losses_.data(),
                               targets, N, grad_scale, stats_.data(), all_stats_.data());
}

void Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale, const UnitHooks* hooks) {
  CLEAVE_CHECK(T <= cfg_.max_seq_len, "sequence of " << T << " tokens exceeds max_seq_len "
                                                     << cfg_.max_seq_len);
  reserve(B, T);
  const int64_t N = B * T, n = local_rows(N);
  CLEAVE_CHECK(n * tp_.size() == N || !tp_.sequence_parallel,
               B << " x " << T << " tokens cannot be split in " << tp_.size()
                 << " equal parts for sequence parallelism");
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
  final_norm_->forward(hf_.data(), resid_[cfg_.n_layers].data(), n);
  const float* hf = hf_.data();  // the head is column-parallel (over the vocabulary)
  if (tp_.sequence_parallel) {
    tp_pairs::gather_forward(*tp_.comm, hf_.data(), hf_full_.data(), n * cfg_.d_model)();
    hf = hf_full_.data();
  } else if (tp_.comm) {
    tp_pairs::copy_forward();
    if (tp_.check_placements)
      tp_.comm->check_replicated(hf, N * cfg_.d_model, "lm_head input (Replicate on tp)");
  }
  head_gemm_->forward(logits_.data(), hf, N, nullptr);
  loss(targets, N, grad_scale);
  if (cfg_.tie_embeddings) call(hooks ? hooks->after_forward : nullptr, 0);
  call(hooks ? hooks->after_forward : nullptr, head);
}

void Transformer::backward(const UnitHooks* hooks) {
  const int64_t N = B_ * T_, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  const int head = n_units() - 1;
  auto call = [&](const std::function<void(int)>& hook, int unit) {
    if (hooks && hook) hook(unit);
  };
  // logits_ holds dlogits now (the loss kernel overwrote it).
  float* d_out = d_resid_a_.data();
  float* d_in = d_resid_b_.data();
  call(hooks ? hooks->before_backward : nullptr, head);
  if (cfg_.tie_embeddings) call(hooks ? hooks->before_backward : nullptr, 0);
  // The head's input gradient is a partial sum over the vocabulary shards: reduced over tp
  // while the head's weight gradient runs.
  head_gemm_->backward_input(sp ? d_full_.data() : d_hf_.data(), logits_.data(), N, false);
  TpComm::Wait reduced = [] {};
  if (sp) reduced = tp_pairs::gather_backward(*tp_.comm, d_full_.data(), d_hf_.data(), n * d);
  else if (tp_.comm) reduced = tp_pairs::copy_backward(*tp_.comm, d_hf_.data(), N * d);
  head_gemm_->backward_weight(store_.grad(head_), nullptr, logits_.data(),
                              sp ? hf_full_.data() : hf_.data(), N);
  reduced();
  std::memset(d_out, 0, n * d * sizeof(float));
  final_norm_->backward_input(d_out, d_hf_.data(), resid_[cfg_.n_layers].data(), n);
  if (sp) start_gather_rows(*tp_.comm, grads_, d_out, n * d);  // for the last block
  final_norm_->backward_weight(d_hf_.data(), resid_[cfg_.n_layers].data(), n);
  call(hooks ? hooks->after_backward : nullptr, head);
  for (int l = cfg_.n_layers - 1; l >= 0; --l) {
    call(hooks ? hooks->before_backward : nullptr, l + 1);
    blocks_[l]->backward(d_in, d_out, grads_);
    call(hooks ? hooks->after_backward : nullptr, l + 1);
    std::swap(d_in, d_out);
  }
  if (!cfg_.tie_embeddings) call(hooks ? hooks->before_backward : nullptr, 0);
  if (!tp_.comm) {
    kernels::embedding_backward(store_.grad(wte_), wpe_ >= 0 ? store_.grad(wpe_) : nullptr, d_out,
                                tokens_, B_, T_, cfg_.d_model);
  } else {
    // The lookup's gradient needs every row (all-gather under sequence parallelism, the
    // conjugate of forward's reduce-scatter); positions take the rank's rows.
    if (wpe_ >= 0)
      kernels::position_backward(store_.grad(wpe_), d_out, n, sp ? tp_.rank() * n : 0, T_,
                                 int(d));
    const float* d_all = sp ? gathered_rows(*tp_.comm, grads_, d_out, n * d) : d_out;
    kernels::embedding_backward_shard(store_.grad(wte_), d_all, tokens_, N, int(d),
                                      share_.vocab_begin, share_.vocab_real);
  }
  call(hooks ? hooks->after_backward : nullptr, 0);
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
  CLEAVE_CHECK(!tp_.comm, "generation runs at tp = 1 (the model has tp " << tp_.size() << ")");
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

namespace {

// A tp group's size and rank for building one rank's share of a model without running it.
class PlannedTp final : public TpComm {
 public:
  explicit PlannedTp(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Wait all_reduce(float*, int64_t) override { return unused(); }
  Wait all_gather(const float*, float*, int64_t) override { return unused(); }
  Wait reduce_scatter(const float*, float*, int64_t) override { return unused(); }
  void check_replicated(const float*, int64_t, const std::string&) override { unused(); }

 private:
  [[noreturn]] static Wait unused() { CLEAVE_FAIL("a planned tp group does not communicate"); }
  int size_;
};

}  // namespace

std::unique_ptr<Transformer> Transformer::planned(const ModelConfig& cfg, int tp,
                                                  bool sequence_parallel) {
  auto group = std::make_unique<PlannedTp>(tp);
  TensorParallelOptions options;
  if (tp > 1) options = {group.get(), sequence_parallel, false};
  auto model = std::make_unique<Transformer>(cfg, Precision::fp32, 0, 1, false, options);
  model->planned_group_ = std::move(group);
  return model;
}

int64_t Transformer::matmul_params() const {
  const ModelConfig& c = cfg_;
  const int64_t per_block = int64_t(c.d_model) * c.qkv_dim() +
                            int64_t(c.n_heads) * c.head_dim() * c.d_model +
                            int64_t(c.d_model) * c.mlp_in_dim() + int64_t(c.ffn_hidden) * c.d_model;
  return per_block * c.n_layers + int64_t(c.vocab_size) * c.d_model;
}

}  // namespace cleave
