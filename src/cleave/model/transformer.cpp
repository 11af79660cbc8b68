#include "cleave/model/transformer.h"

#include <algorithm>
#include <cstring>

#include "cleave/kernels/cross_entropy.h"
#include "cleave/kernels/embedding.h"
#include "cleave/model/context_attention.h"
#include "cleave/model/tp_pairs.h"

namespace cleave {

namespace {

// The rank's rows of a [vocab, d] tensor: padded to ceil(vocab / tp) rows, the padding in no
// global row.
Placement vocab_placement(const ModelConfig& c, const TpShare& s) {
  if (s.tp == 1) return {};
  std::vector<Segment> rows;
  if (s.vocab_real > 0) rows.push_back({0, s.vocab_begin, s.vocab_real, ""});
  return shard_rows({c.vocab_size, c.d_model}, std::move(rows));
}

}  // namespace

Transformer::Transformer(const ModelConfig& c, Precision precision, uint64_t seed,
                         int64_t pad_multiple, ParamValues values, const TensorParallelOptions& tp,
                         std::vector<ModelChunk> chunks, const ContextParallelOptions& cp,
                         EpComm* ep)
    : cfg_(c), precision_(precision), tp_(tp), share_(tp_share(c, tp.size(), tp.rank())),
      chunks_(std::move(chunks)) {
  if (chunks_.empty()) chunks_.push_back({0, c.n_layers, true, true});
  const std::string sp_sum = tp.sequence_parallel ? kTpAxis : "";
  ContextParallelOptions context = cp;
  cp_group_ = cp.enabled() ? cp.group : nullptr;
  if (context.enabled() && !context.work) context.work = std::make_shared<ContextWork>();
  auto new_unit = [&](UnitKind kind, int layer, int chunk) {
    store_.begin_unit();
    units_.push_back({kind, layer, chunk, {n_units()}});
    chunk_units_[size_t(chunk)].push_back(n_units() - 1);
    block_of_unit_.push_back(-1);
  };
  chunk_units_.resize(chunks_.size());
  MoeOptions moe;
  moe.ep = ep;
  if (cp.enabled()) moe.sequence = cp.group;
  if (c.moe_experts > 0) moe.expert_group = store_.add_group("experts");
  int embedding_unit = -1;
  for (int ch = 0; ch < int(chunks_.size()); ++ch) {
    const ModelChunk& k = chunks_[size_t(ch)];
    if (k.embedding) {
      new_unit(UnitKind::embedding, -1, ch);
      embedding_unit = n_units() - 1;
      wte_ = store_.add("embed.wte", {share_.vocab_rows, c.d_model}, Init::normal, c.init_std,
                        vocab_placement(c, share_));
      if (c.family == Family::gpt2)
        wpe_ = store_.add("embed.wpe", {c.max_seq_len, c.d_model}, Init::normal, c.init_std,
                          pending_sum(sp_sum));
    }
    if (c.family == Family::llama && !rope_) rope_.emplace(c.head_dim(), c.max_seq_len, c.rope_theta);
    // Units (embeddings, each block, the head) start at multiples of pad_multiple, so each can
    // be sharded in equal parts.
    for (int l = k.first_layer; l < k.end_layer; ++l) {
      new_unit(UnitKind::block, l, ch);
      block_of_unit_.back() = int(blocks_.size());
      blocks_.push_back(
          std::make_unique<Block>(store_, l, cfg_, precision, rope_ ? &*rope_ : nullptr, spares_,
                                  tp, context, moe));
    }
    if (k.head) {
      new_unit(UnitKind::head, -1, ch);
      final_norm_ = std::make_unique<Norm>(store_, "final_norm", c.d_model,
                                           c.family == Family::gpt2, c.norm_eps, sp_sum);
      if (!c.tie_embeddings) {
        head_ = store_.add("lm_head.weight", {share_.vocab_rows, c.d_model}, Init::normal,
                           c.init_std, vocab_placement(c, share_));
      } else if (embedding_unit >= 0) {
        head_ = wte_;
        units_.back().uses.push_back(embedding_unit);
      } else {
        Placement copy = vocab_placement(c, share_);
        copy.tied_copy = true;
        head_ = tied_tensor_ = store_.add("embed.wte", {share_.vocab_rows, c.d_model},
                                          Init::normal, c.init_std, copy);
      }
      head_gemm_ = std::make_unique<LinearGemm>(c.d_model, int(share_.vocab_rows),
                                                product_dtype(precision));
    }
  }
  // The first stage's embedding is the tied copy's owner.
  if (c.tie_embeddings && wte_ >= 0 && !head_gemm_) tied_tensor_ = wte_;

  store_.allocate(seed, pad_multiple, values);
  for (auto& b : blocks_) b->bind(store_);
  saved_.resize(units_.size());
  if (final_norm_) final_norm_->bind(store_);
  if (head_gemm_) store_.keep_packed(head_, head_gemm_.get());
}

std::vector<std::pair<std::string, LinearGemm*>> Transformer::fp8_gemms() {
  std::vector<std::pair<std::string, LinearGemm*>> gemms;
  for (int i = 0; i < int(store_.tensors().size()); ++i)
    if (store_.fp8_weight(i)) gemms.push_back({store_.tensor(i).name, store_.packed_by(i)});
  return gemms;
}

void Transformer::set_fp8(kernels::Fp8Recipe recipe, int margin) {
  amax_tp_cp_ = std::make_unique<GroupAmax>(tp_.comm, cp_group_);
  amax_tp_ = std::make_unique<GroupAmax>(tp_.comm, nullptr);
  for (int i = 0; i < int(store_.tensors().size()); ++i) {
    if (!store_.fp8_weight(i)) continue;
    // An expert's rows come from several ranks' batches: their amax is the expert's own.
    const bool expert = store_.group_name(store_.tensor(i).group) == "experts";
    store_.packed_by(i)->set_fp8(
        {recipe, margin, expert ? amax_tp_.get() : amax_tp_cp_.get(), amax_tp_.get()});
  }
}

void Transformer::prepare(int64_t B, int64_t T, const std::vector<int>& slots) {
  CLEAVE_CHECK(slots.size() == chunks_.size(),
               slots.size() << " slot counts for " << chunks_.size() << " chunks");
  CLEAVE_CHECK(T <= cfg_.max_seq_len, "sequence of " << T << " tokens exceeds max_seq_len "
                                                     << cfg_.max_seq_len);
  size_slots(B, T, slots);
}

void Transformer::size_slots(int64_t B, int64_t T, const std::vector<int>& slots) {
  const int64_t N = B * T, n = local_rows(N);
  CLEAVE_CHECK(n * tp_.size() == N || !tp_.sequence_parallel,
               B << " x " << T << " tokens cannot be split in " << tp_.size()
                 << " equal parts for sequence parallelism");
  const bool same_shape = B == B_ && T == T_;
  slots_.resize(chunks_.size());
  for (size_t ch = 0; ch < chunks_.size(); ++ch) {
    if (same_shape && int(slots_[ch].size()) == slots[ch]) continue;
    slots_[ch].resize(size_t(slots[ch]));
    const ModelChunk& k = chunks_[ch];
    const SlotShape shape = slot_shape(k, N);
    for (Slot& s : slots_[ch]) {
      s.stream.resize(size_t(shape.streams));
      for (auto& r : s.stream) r.fit(shape.stream);
      for (Buffer<float>* b : {&s.d_output, &s.d_input, &s.d_a, &s.d_b}) b->fit(shape.stream);
      if (!k.head) continue;
      s.hf.fit(shape.hf);
      s.logits.fit(shape.logits);
      s.losses.fit(shape.losses);
      if (shape.d_head_in > 0) s.d_head_in.fit(shape.d_head_in);
      if (shape.hf_full > 0) s.hf_full.fit(shape.hf_full);
    }
  }
  for (int u = 0; u < n_units(); ++u)
    if (units_[size_t(u)].kind == UnitKind::block)
      saved_[size_t(u)].resize(size_t(slots[size_t(units_[size_t(u)].chunk)]));
  if (same_shape) return;
  const ModelFloats own = model_floats(N);
  d_hf_.fit(own.d_hf);
  if (tp_.comm) {
    stats_.fit(3 * head_chunk(N));
    all_stats_.fit(3 * head_chunk(N) * tp_.size());
  }
  embed_full_.fit(own.embed_full);
  d_full_.fit(own.d_full);
  reserve_block_grads(grads_, N);
  B_ = B, T_ = T;
}

void Transformer::reserve_block_grads(BlockGrads& g, int64_t N) const {
  // The scratch is shared: the first dense block and the first MoE block size what each needs.
  bool dense = false, moe = false;
  for (const auto& b : blocks_) {
    bool& seen = b->moe() ? moe : dense;
    if (!seen) b->reserve_grads(g, N);
    seen = true;
  }
}

int64_t Transformer::backward_scratch_bytes(int64_t B, int64_t T) const {
  const int64_t before = buffer_bytes_owned;
  BlockGrads g;
  reserve_block_grads(g, B * T);  // mapped or allocated, never touched: no memory is used
  return buffer_bytes_owned - before;
}

LinearGemm::ThreadScratch Transformer::product_scratch_bytes(int64_t N) const {
  LinearGemm::ThreadScratch s;
  for (int i = 0; i < int(store_.tensors().size()); ++i)
    if (const LinearGemm* g = store_.packed_by(i))
      s.at_least(g->thread_scratch_bytes(g == head_gemm_.get() ? head_chunk(N) : N));
  return s;
}

Transformer::SlotShape Transformer::slot_shape(const ModelChunk& k, int64_t N) const {
  const int64_t d = cfg_.d_model, n = local_rows(N);
  SlotShape s;
  s.streams = k.end_layer - k.first_layer + 1;
  s.stream = n * d;
  if (!k.head) return s;
  s.hf = n * d;
  s.logits = head_chunk(N) * share_.vocab_rows;
  s.losses = N;
  if (head_chunk(N) < N) s.d_head_in = N * d;
  if (tp_.sequence_parallel) s.hf_full = N * d;
  return s;
}

Transformer::ModelFloats Transformer::model_floats(int64_t N) const {
  const int64_t d = cfg_.d_model, n = local_rows(N);
  const bool head = chunks_.back().head, chunked = head_chunk(N) < N, sp = tp_.sequence_parallel;
  ModelFloats m;
  // The head's input gradient: sequence parallelism gathers the rank's rows into d_hf_ (from
  // d_full_ unless the loss is chunked); otherwise it is d_hf_ itself unless chunked.
  if (head) m.d_hf = sp ? n * d : chunked ? 0 : N * d;
  if (head && sp && !chunked) m.d_full = N * d;
  if (chunks_.front().embedding && sp) m.embed_full = N * d;
  return m;
}

SavedBytes Transformer::block_saved_bytes(int unit, int64_t B, int64_t T) const {
  CLEAVE_CHECK(units_[size_t(unit)].kind == UnitKind::block, "unit " << unit << " is no block");
  return blocks_[size_t(block_of_unit_[size_t(unit)])]->saved_bytes(B * T);
}

int64_t Transformer::slot_bytes(int64_t B, int64_t T, const std::vector<int>& slots) const {
  const int64_t N = B * T, n = local_rows(N);
  int64_t floats = 0, copies = 0;
  for (size_t ch = 0; ch < chunks_.size(); ++ch) {
    const ModelChunk& k = chunks_[ch];
    floats += slots[ch] * slot_shape(k, N).floats();
    // The head's: the final norm's statistics; its input's bf16 copy, per slot, and its output
    // gradient's, once.
    if (k.head) {
      floats += slots[ch] * 2 * n;
      copies += slots[ch] * head_gemm_->kept_copy_bytes(head_chunk(N));
      if (head_gemm_->precision() == Precision::bf16)
        copies += head_chunk(N) * share_.vocab_rows * int64_t(sizeof(bf16));
    }
  }
  const ModelFloats own = model_floats(N);
  floats += own.d_hf + own.d_full + own.embed_full;
  return floats * kFloatBytes + copies;
}

float* Transformer::chunk_input(int chunk, int slot) { return slot_of(chunk, slot).stream.front().data(); }
const float* Transformer::chunk_output(int chunk, int slot) {
  return slot_of(chunk, slot).stream.back().data();
}
float* Transformer::chunk_output_grad(int chunk, int slot) {
  return slot_of(chunk, slot).d_output.data();
}
const float* Transformer::chunk_input_grad(int chunk, int slot) {
  return slot_of(chunk, slot).d_input.data();
}

void Transformer::embed(float* out, const int32_t* tokens, const int32_t* positions, int64_t N) {
  if (!tp_.comm) {
    kernels::embedding_forward(out, tokens, store_.value(wte_),
                               wpe_ >= 0 ? store_.value(wpe_) : nullptr, positions, N,
                               cfg_.d_model, cfg_.max_seq_len);
    return;
  }
  // Vocabulary-parallel: each rank looks up the tokens it holds (0 for the others) and the tp
  // sum completes the lookup (a row-parallel output: all-reduce, or reduce-scatter into the
  // rank's rows). Positions are added after the sum, to the rank's rows.
  const int64_t n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  kernels::embedding_lookup_shard(sp ? embed_full_.data() : out, tokens, store_.value(wte_), N,
                                  int(d), share_.vocab_begin, share_.vocab_real);
  if (sp) tp_pairs::scatter_forward(*tp_.comm, embed_full_.data(), out, n * d)();
  else tp_pairs::reduce_forward(*tp_.comm, out, N * d)();
  if (wpe_ >= 0)
    kernels::position_add(out, store_.value(wpe_), positions + (sp ? tp_.rank() * n : 0), n,
                          int(d));
}

int64_t Transformer::head_chunk(int64_t N) const {
  return loss_chunk_ > 0 && loss_chunk_ < N ? loss_chunk_ : N;
}

const float* Transformer::logits() const {
  CLEAVE_CHECK(head_chunk(B_ * T_) == B_ * T_, "the logits of a chunked loss (train.loss_chunk = "
                                            << loss_chunk_ << ") never exist whole");
  return head_slot(0).logits.data();
}

void Transformer::loss(Slot& s, const Batch& batch, int64_t r0, int64_t rows, float grad_scale) {
  const int32_t* targets = batch.targets.data() + r0;
  float* losses = s.losses.data() + r0;
  if (!tp_.comm)
    kernels::cross_entropy_forward_backward(s.logits.data(), losses, targets, rows,
                                            cfg_.vocab_size, grad_scale);
  else
    vocab_parallel_cross_entropy(tp_, share_, cfg_.vocab_size, s.logits.data(), losses, targets,
                                 rows, grad_scale, stats_.data(), all_stats_.data());
  if (batch.valid_tokens == batch.B * batch.T) return;
  // A masked token's loss is no part of the sum, and its logits get no gradient.
  const int64_t columns = share_.vocab_rows;
  for (int64_t i = 0; i < rows; ++i)
    if (!batch.loss_mask[size_t(r0 + i)]) {
      losses[i] = 0;
      if (grad_scale != 0)
        std::fill(s.logits.data() + i * columns, s.logits.data() + (i + 1) * columns, 0.0f);
    }
}

void Transformer::forward_unit(int unit, int slot, const Batch& batch, float grad_scale) {
  const Unit& u = units_[size_t(unit)];
  Slot& s = slot_of(u.chunk, slot);
  CLEAVE_CHECK(batch.B == B_ && batch.T == T_, "a batch of " << batch.B << " x " << batch.T
                                                << " tokens for a model prepared for " << B_
                                                << " x " << T_);
  s.batch = &batch;
  if (!recomputing_) s.grad_scale = grad_scale;
  switch (u.kind) {
    case UnitKind::embedding:
      embed(s.stream.front().data(), batch.tokens.data(), batch.positions.data(), B_ * T_);
      break;
    case UnitKind::block: {
      const int k = u.layer - chunks_[size_t(u.chunk)].first_layer;  // within the chunk
      // Routing statistics count the forwards that prepare a backward, once each.
      const int b = block_of_unit_[size_t(unit)];
      KvLayer layer;
      if (batch.cached()) {
        CLEAVE_CHECK(pool_, "a batch over a key/value cache outside forward_cached");
        layer = pool_->layer(b);
      }
      blocks_[size_t(b)]->forward(saved_[size_t(unit)].at(size_t(slot)),
                                  s.stream[size_t(k) + 1].data(), s.stream[size_t(k)].data(),
                                  batch, grads_, batch.cached() ? &layer : nullptr, grad_scale,
                                  grad_scale != 0 && !recomputing_);
      break;
    }
    case UnitKind::head:
      if (batch.cached()) head_logit_rows(s, batch);
      else head_forward(s, batch, grad_scale);
      break;
  }
}

void Transformer::head_forward(Slot& s, const Batch& batch, float grad_scale) {
  const int64_t N = B_ * T_, n = local_rows(N);
  final_norm_->forward(s.hf.data(), s.stream.back().data(), n, s.final_norm);
  const float* hf = s.hf.data();  // the head is column-parallel (over the vocabulary)
  if (tp_.sequence_parallel) {
    tp_pairs::gather_forward(*tp_.comm, s.hf.data(), s.hf_full.data(), n * cfg_.d_model)();
    hf = s.hf_full.data();
  } else if (tp_.comm) {
    tp_pairs::copy_forward();
    if (tp_.check_placements)
      tp_.comm->check_replicated(hf, N * cfg_.d_model, "lm_head input (Replicate on tp)");
  }
  const int64_t C = head_chunk(N), d = cfg_.d_model;
  if (C == N) {
    head_gemm_->forward(s.logits.data(), hf, N, nullptr, &s.head_x);
    loss(s, batch, 0, N, grad_scale);
    return;
  }
  // Chunk by chunk: logits, loss and dlogits, then at once the head's input gradient and its
  // weight gradient (+=) from them, while the chunk's logits are at hand.
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t rows = std::min(C, N - r0);
    head_gemm_->forward(s.logits.data(), hf + r0 * d, rows, nullptr, &s.head_x);
    loss(s, batch, r0, rows, grad_scale);
    if (grad_scale == 0) continue;
    head_gemm_->backward_input(s.d_head_in.data() + r0 * d, s.logits.data(), rows, false,
                               &d_logits_);
    head_gemm_->backward_weight(store_.grad(head_), nullptr, s.logits.data(), hf + r0 * d, rows,
                                &d_logits_, &s.head_x);
  }
}

void Transformer::backward_unit(int unit, int slot, BackwardPart part) {
  const Unit& u = units_[size_t(unit)];
  Slot& s = slot_of(u.chunk, slot);
  // The head and the embeddings have no weight-gradient half of their own: the head's weight
  // gradient is one product done with its input gradient, and the embeddings' backward is all
  // weight gradient. Their whole backward runs in the input part (or both).
  if (u.kind != UnitKind::block && part == BackwardPart::weight) return;
  switch (u.kind) {
    case UnitKind::head:
      head_backward(s);
      break;
    case UnitKind::block: {
      const ModelChunk& chunk = chunks_[size_t(u.chunk)];
      const bool last = u.layer == chunk.end_layer - 1;
      const bool first = u.layer == chunk.first_layer;
      Block& b = *blocks_[size_t(block_of_unit_[size_t(unit)])];
      Block::Saved& saved = saved_[size_t(unit)].at(size_t(slot));
      if (part == BackwardPart::weight) {
        b.backward(saved, nullptr, nullptr, grads_, part);
        break;
      }
      const float* d_out = last && !chunk.head ? s.d_output.data() : s.d_stream;
      float* d_in = first && !chunk.embedding ? s.d_input.data()
                    : d_out == s.d_a.data()   ? s.d_b.data()
                                              : s.d_a.data();
      b.backward(saved, d_in, d_out, grads_, part);
      s.d_stream = d_in;
      break;
    }
    case UnitKind::embedding:
      embedding_backward(s, s.d_stream);
      break;
  }
}

void Transformer::release_saved(int unit, int slot) {
  CLEAVE_CHECK(units_[size_t(unit)].kind == UnitKind::block, "unit " << unit << " is no block");
  Block::Saved& saved = saved_[size_t(unit)].at(size_t(slot));
  const Block& block = *blocks_[size_t(block_of_unit_[size_t(unit)])];
  if (selective_recompute_)
    block.release_recomputable(saved);
  else
    block.release_all(saved);
}

void Transformer::recompute(int unit, int slot) {
  CLEAVE_CHECK(units_[size_t(unit)].kind == UnitKind::block, "unit " << unit << " is no block");
  if (selective_recompute_)
    blocks_[size_t(block_of_unit_[size_t(unit)])]->recompute_cheap(
        saved_[size_t(unit)].at(size_t(slot)));
  else {
    const Slot& s = slot_of(units_[size_t(unit)].chunk, slot);
    recomputing_ = true;
    forward_unit(unit, slot, *s.batch, s.grad_scale);
    recomputing_ = false;
  }
}

void Transformer::head_backward(Slot& s) {
  const int64_t N = B_ * T_, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  // logits hold dlogits now (the loss kernel overwrote them). The head's input gradient is a
  // partial sum over the vocabulary shards: reduced over tp while the head's weight gradient runs.
  // A chunked loss computed both in the head's forward.
  const bool chunked = head_chunk(N) < N;
  float* d_in = chunked ? s.d_head_in.data() : sp ? d_full_.data() : d_hf_.data();
  if (!chunked) head_gemm_->backward_input(d_in, s.logits.data(), N, false, &d_logits_);
  TpComm::Wait reduced = [] {};
  if (sp) reduced = tp_pairs::gather_backward(*tp_.comm, d_in, d_hf_.data(), n * d);
  else if (tp_.comm) reduced = tp_pairs::copy_backward(*tp_.comm, d_in, N * d);
  if (!chunked)
    head_gemm_->backward_weight(store_.grad(head_), nullptr, s.logits.data(),
                                sp ? s.hf_full.data() : s.hf.data(), N, &d_logits_, &s.head_x);
  reduced();
  const float* d_hf = sp ? d_hf_.data() : d_in;  // the final norm's output gradient
  float* d_out = s.d_a.data();
  std::memset(d_out, 0, n * d * sizeof(float));
  final_norm_->backward_input(d_out, d_hf, s.stream.back().data(), n, s.final_norm);
  if (sp) start_gather_rows(*tp_.comm, grads_, d_out, n * d);  // for the last block
  final_norm_->backward_weight(d_hf, s.stream.back().data(), n, s.final_norm);
  s.d_stream = d_out;
}

void Transformer::embedding_backward(Slot& s, const float* d_out) {
  const int64_t N = B_ * T_, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  const int32_t* tokens = s.batch->tokens.data();
  const int32_t* positions = s.batch->positions.data();
  if (!tp_.comm) {
    kernels::embedding_backward(store_.grad(wte_), wpe_ >= 0 ? store_.grad(wpe_) : nullptr, d_out,
                                tokens, positions, N, cfg_.d_model);
    return;
  }
  // The lookup's gradient needs every row (all-gather under sequence parallelism, the
  // conjugate of forward's reduce-scatter); positions take the rank's rows.
  if (wpe_ >= 0)
    kernels::position_backward(store_.grad(wpe_), d_out, positions + (sp ? tp_.rank() * n : 0), n,
                               int(d));
  const float* d_all = sp ? gathered_rows(*tp_.comm, grads_, d_out, n * d) : d_out;
  kernels::embedding_backward_shard(store_.grad(wte_), d_all, tokens, N, int(d),
                                    share_.vocab_begin, share_.vocab_real);
}

void Transformer::forward(const Batch& batch, float grad_scale) {
  CLEAVE_CHECK(chunks_.size() == 1 && chunks_[0].embedding && chunks_[0].head,
               "Transformer::forward runs the whole model; this rank holds pipeline stages");
  prepare(batch.B, batch.T, {1});
  for (int u = 0; u < n_units(); ++u) forward_unit(u, 0, batch, grad_scale);
}

void Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          float grad_scale) {
  whole_.whole_sequences(B, T);
  std::copy(tokens, tokens + B * T, whole_.tokens.begin());
  std::copy(targets, targets + B * T, whole_.targets.begin());
  forward(whole_, grad_scale);
}

void Transformer::backward() {
  for (int u = n_units() - 1; u >= 0; --u) backward_unit(u, 0);
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
                                                  bool sequence_parallel,
                                                  std::vector<ModelChunk> chunks,
                                                  Precision precision,
                                                  int64_t pad_multiple) {
  auto group = std::make_unique<PlannedTp>(tp);
  TensorParallelOptions options;
  if (tp > 1) options = {group.get(), sequence_parallel, false};
  auto model = std::make_unique<Transformer>(cfg, precision, 0, pad_multiple,
                                             ParamValues::planned, options, std::move(chunks));
  model->planned_group_ = std::move(group);
  return model;
}

int64_t matmul_params(const ModelConfig& c) {
  const int64_t d = c.d_model, attention = d * c.qkv_dim() + int64_t(c.n_heads) * c.head_dim() * d;
  // An MLP of h hidden units: fc (2h rows for SwiGLU) and proj.
  auto mlp = [&](int64_t h) { return d * h * (c.family == Family::llama ? 2 : 1) + h * d; };
  int64_t total = int64_t(c.vocab_size) * d;
  for (int l = 0; l < c.n_layers; ++l) {
    total += attention;
    if (c.is_moe_layer(l))
      total += d * c.moe_experts + (int64_t(c.moe_top_k) + c.moe_shared_experts) * mlp(c.moe_ffn_hidden);
    else
      total += mlp(c.ffn_hidden);
  }
  return total;
}

double model_flops_per_token(const ModelConfig& cfg, int seq_len) {
  return 6.0 * double(matmul_params(cfg)) + 6.0 * cfg.n_layers * double(seq_len) * cfg.d_model;
}

std::vector<MoeLayerStats> Transformer::take_moe_stats() {
  std::vector<MoeLayerStats> out;
  for (auto& b : blocks_)
    if (Moe* m = b->moe()) out.push_back(m->take_stats());
  return out;
}

std::vector<Moe*> Transformer::moe_layers() {
  std::vector<Moe*> out;
  for (auto& b : blocks_)
    if (Moe* m = b->moe()) out.push_back(m);
  return out;
}

void Transformer::update_moe_bias(int layer, const std::vector<double>& load) {
  for (auto& b : blocks_)
    if (Moe* m = b->moe(); m && m->layer() == layer) m->update_bias(load);
}

std::map<int, std::vector<float>> Transformer::moe_bias_values() {
  std::map<int, std::vector<float>> out;
  for (const auto& [layer, bias] : moe_biases()) out[layer] = *bias;
  return out;
}

std::vector<std::pair<int, std::vector<float>*>> Transformer::moe_biases() {
  std::vector<std::pair<int, std::vector<float>*>> out;
  for (auto& b : blocks_)
    if (Moe* m = b->moe(); m && !m->bias().empty()) out.push_back({m->layer(), &m->bias()});
  return out;
}

}  // namespace cleave
