#include "cleave/model/self_attention.h"

#include <cstring>

#include "cleave/base/bf16_round.h"

namespace cleave {

namespace {

// qkv's rows on a tp rank: its q heads, then its k heads, then its v heads, from the three parts
// of the global [q | k | v] (none at tp = 1: the whole tensor).
Placement qkv_placement(const ModelConfig& c, const TpShare& s) {
  if (s.tp == 1) return {};
  const int64_t hd = c.head_dim(), q = int64_t(s.heads) * hd, kv = int64_t(s.kv_heads) * hd;
  const std::string kv_sum = s.kv_replicated ? kKvReplicasAxis : "";
  const int64_t k0 = int64_t(c.n_heads) * hd, v0 = k0 + int64_t(c.n_kv_heads) * hd;
  return shard_rows({c.qkv_dim(), c.d_model},
                    {{0, s.rank * q, q, ""},
                     {q, k0 + s.first_kv_head * hd, kv, kv_sum},
                     {q + kv, v0 + s.first_kv_head * hd, kv, kv_sum}});
}

}  // namespace

void SelfAttention::Saved::release() {
  for (Buffer<float>* b : {&qkv, &o, &dy, &d_qkv, &cache_lse}) *b = Buffer<float>();
  if (core) core->release();
  x_copy = OperandCopy();
  o_copy = OperandCopy();
  B = T = 0;
}

SelfAttention::SelfAttention(ParamStore& store, const std::string& name, const ModelConfig& c,
                             const TpShare& share, Precision p, const kernels::RopeTable* rope,
                             const ContextParallelOptions& cp)
    : cfg_(c), share_(share), rope_(rope),
      qkv_(store, name + ".qkv", c.d_model, share.qkv_dim(c.head_dim()), c.family == Family::gpt2,
           c.init_std, p, qkv_placement(c, share)),
      out_(store, name + ".out", share.heads * c.head_dim(), c.d_model, c.family == Family::gpt2,
           c.residual_init_std(), p,
           row_parallel(share, c.d_model, c.n_heads * c.head_dim(), share.heads * c.head_dim())),
      core_(make_attention_core(cp, share.heads, share.kv_heads, c.head_dim())) {}

void SelfAttention::bind(ParamStore& store) {
  qkv_.bind(store);
  out_.bind(store);
}

void SelfAttention::reserve(Scratch& g, int64_t N) const {
  g.d_o.fit(N * share_.heads * cfg_.head_dim());
  g.d_qkv.fit(N * share_.qkv_dim(cfg_.head_dim()));
}

void SelfAttention::rotate(Saved& s, const int32_t* positions) {
  const int64_t qkv_dim = share_.qkv_dim(cfg_.head_dim());
  if (rope_)  // q and k heads are adjacent at the start of each row: rotate them together
    kernels::rope_forward(s.qkv.data(), *rope_, s.B * s.T, share_.heads + share_.kv_heads, qkv_dim,
                          positions);
}

void SelfAttention::take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const {
  const int64_t hd = cfg_.head_dim(), q_dim = int64_t(share_.heads) * hd;
  spares.floats.fill(s.qkv, N * share_.qkv_dim(int(hd)));
  spares.floats.fill(s.o, N * q_dim);
  if (!s.core) s.core = core_->new_saved();
  core_->take_spares(*s.core, spares, N);
  spares.copies.reuse(s.x_copy.data, N * qkv_.gemm().in_features());
  spares.copies.reuse(s.o_copy.data, N * q_dim);
}

void SelfAttention::give_all(Saved& s, RecomputeSpares& spares) const {
  for (Buffer<float>* b : {&s.qkv, &s.o}) spares.floats.give(*b);
  if (s.core) core_->give_all(*s.core, spares);
  spares.copies.give(s.x_copy.data);
  spares.copies.give(s.o_copy.data);
  s.release();
}

SavedBytes SelfAttention::saved_bytes(int64_t N, bool keep_x) const {
  const int64_t qkv_dim = share_.qkv_dim(cfg_.head_dim()), q_dim = int64_t(share_.heads) * cfg_.head_dim();
  SavedBytes b;
  b.kept = ((core_->reads_qkv() ? N * qkv_dim : 0) + N * q_dim) * kFloatBytes +
           core_->saved_bytes(N) + out_.gemm().kept_copy_bytes(N);
  b.recomputable = keep_x ? qkv_.gemm().kept_copy_bytes(N) : 0;
  b.deferred = N * (cfg_.d_model + qkv_dim) * kFloatBytes;  // dy, d_qkv
  return b;
}

void SelfAttention::recompute_input_copy(Saved& s, const float* x) {
  if (s.x_kept) qkv_.gemm().copy_operand(x, s.B * s.T * qkv_.gemm().in_features(), s.x_copy);
}

void SelfAttention::forward(Saved& s, float* y, const float* x, const Batch& batch, bool keep_x,
                            const KvLayer* cache) {
  const int64_t B = batch.B, T = batch.T, N = B * T, hd = cfg_.head_dim();
  const int64_t q_dim = int64_t(share_.heads) * hd, qkv_dim = share_.qkv_dim(int(hd));
  // Fitted, not resized (a resize maps fresh pages; under Ulysses qkv is freed after each
  // forward); the log-sum-exps are the attention core's.
  s.qkv.fit(N * qkv_dim);
  s.o.fit(N * q_dim);
  if (!s.core) s.core = core_->new_saved();
  s.B = B, s.T = T;
  s.positions = batch.positions.data();
  s.documents = batch.documents.empty() ? nullptr : batch.documents.data();
  s.sequence_documents =
      batch.sequence_documents.empty() ? nullptr : batch.sequence_documents.data();
  s.x_kept = keep_x;
  qkv_.forward(s.qkv.data(), x, N, keep_x ? &s.x_copy : nullptr);
  rotate(s, s.positions);
  if (!cache) {
    core_->forward(*s.core, s.o.data(), s.qkv.data(), rows(s));
    // Under Ulysses attention keeps its own copy of q, k and v (its heads over the sequence):
    // the rank's is freed, a page-fault per forward traded for a q|k|v per layer and micro-batch.
    if (!core_->reads_qkv()) s.qkv = Buffer<float>();
  } else {
    attend_cached(s, batch, *cache);
  }
  out_.forward(y, s.o.data(), N, &s.o_copy);
}

void SelfAttention::attend_cached(Saved& s, const Batch& batch, const KvLayer& cache) {
  const int64_t hd = cfg_.head_dim(), q_dim = int64_t(share_.heads) * hd;
  const int64_t kv_dim = int64_t(share_.kv_heads) * hd, qkv_dim = share_.qkv_dim(int(hd));
  const int64_t sequences = int64_t(batch.cache_past.size()), br = cache.block_rows;
  CLEAVE_CHECK(batch.cached(), "a key/value cache for a batch that does not use one");
  CLEAVE_CHECK(cache.row == kv_dim, "a key/value pool of rows of " << cache.row
                                        << " floats for attention's " << kv_dim);
  // The new tokens' keys and values go into their blocks first: each token then attends to
  // its sequence's keys where they all lie.
  for (int64_t sq = 0; sq < sequences; ++sq) {
    const std::span<const int32_t> table = batch.cache_blocks[size_t(sq)];
    for (int64_t r = batch.cache_rows[size_t(sq)]; r < batch.cache_rows[size_t(sq) + 1]; ++r) {
      const int64_t t = batch.cache_past[size_t(sq)] + r - batch.cache_rows[size_t(sq)];
      const int64_t block = int64_t(table[size_t(t / br)]) * br * kv_dim, i = t % br;
      const float* row = s.qkv.data() + r * qkv_dim + q_dim;
      if (cache.k) {
        for (int64_t c = 0; c < kv_dim; ++c) cache.k[block + c * br + i] = row[c];  // transposed
        std::memcpy(cache.v + block + i * kv_dim, row + kv_dim, kv_dim * sizeof(float));
      } else {
        for (int64_t c = 0; c < kv_dim; ++c) cache.k_bf16[block + c * br + i] = to_bf16(row[c]);
        bf16_round_run(cache.v_bf16 + block + i * kv_dim, row + kv_dim, kv_dim);
      }
    }
  }
  const int64_t N = s.B * s.T;
  s.cache_lse.grow(N * share_.heads);
  kernels::PagedAttention p;
  p.n_heads = share_.heads, p.n_kv_heads = share_.kv_heads, p.head_dim = int(hd);
  p.q_row_stride = qkv_dim;
  p.k = cache.k, p.v = cache.v, p.k_bf16 = cache.k_bf16, p.v_bf16 = cache.v_bf16;
  p.kv_row_stride = kv_dim, p.block_rows = br;
  p.sequences = sequences;
  p.rows = batch.cache_rows.data(), p.past = batch.cache_past.data();
  tables_.clear();
  for (const std::span<const int32_t> t : batch.cache_blocks) tables_.push_back(t.data());
  p.blocks = tables_.data();
  kernels::attention_forward_paged(s.o.data(), s.cache_lse.data(), s.qkv.data(), p);
}

void SelfAttention::backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer) {
  const int64_t N = s.B * s.T, d = cfg_.d_model, qkv_dim = share_.qkv_dim(cfg_.head_dim());
  if (defer) {  // fitted, not resized: a resize returns pages
    s.dy.fit(N * d);
    s.d_qkv.fit(N * qkv_dim);
  }
  float* d_qkv = defer ? s.d_qkv.data() : g.d_qkv.data();
  out_.backward_input(g.d_o.data(), dy, N, false, defer ? nullptr : &g.dy_copy);
  core_->backward(*s.core, d_qkv, g.d_o.data(), s.qkv.data(), s.o.data(), rows(s));
  if (rope_)
    kernels::rope_backward(d_qkv, *rope_, N, share_.heads + share_.kv_heads, qkv_dim,
                           s.positions);
  qkv_.backward_input(dx, d_qkv, N, false, defer ? nullptr : &g.dqkv_copy);
  if (defer) std::memcpy(s.dy.data(), dy, N * d * sizeof(float));
  // The output gradients' bf16 copies serve the weight gradients of a whole backward only.
  if (defer) s.weight = {s.dy.data(), d_qkv, nullptr, nullptr};
  else s.weight = {dy, d_qkv, &g.dy_copy, &g.dqkv_copy};
}

void SelfAttention::backward_weight(Saved& s, const float* x) {
  const int64_t N = s.B * s.T;
  const WeightGradInputs& w = s.weight;
  out_.backward_weight(w.dy, s.o.data(), N, w.dy_copy, &s.o_copy);
  qkv_.backward_weight(w.inner, x, N, w.inner_copy, s.x_kept ? &s.x_copy : nullptr);
}

}  // namespace cleave
