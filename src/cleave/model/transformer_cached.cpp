// Transformer's inference half (docs/inference.md): the key/value pool sized for this rank's
// layers and kv heads, and one forward of a ragged batch over it through the training units.
#include "cleave/model/transformer.h"

#include <algorithm>
#include <cstring>

#include "cleave/model/tp_share.h"

namespace cleave {

namespace {

// Everything the units would trust: a row, position, token or block out of range would read or
// write outside its buffer.
void check_ragged(const Batch& b, const KvPool& pool, const ModelConfig& c) {
  const size_t sequences = b.cache_past.size(), N = size_t(b.T);
  CLEAVE_CHECK(b.cache_rows.size() == sequences + 1 && b.cache_blocks.size() == sequences &&
                   b.cache_rows.front() == 0 && b.cache_rows.back() == b.T,
               "a ragged batch of " << b.T << " tokens whose " << sequences
                                    << " sequences do not cover it");
  CLEAVE_CHECK(b.tokens.size() == N && b.positions.size() == N,
               "a ragged batch of " << b.T << " rows with " << b.tokens.size() << " tokens and "
                                    << b.positions.size() << " positions");
  for (size_t r = 0; r < N; ++r)
    CLEAVE_CHECK(b.tokens[r] >= 0 && b.tokens[r] < c.vocab_size,
                 "row " << r << " holds token " << b.tokens[r] << ", outside the vocabulary of "
                        << c.vocab_size);
  for (size_t sq = 0; sq < sequences; ++sq) {
    const int64_t past = b.cache_past[sq], rows = b.cache_rows[sq + 1] - b.cache_rows[sq];
    CLEAVE_CHECK(past >= 0 && rows >= 0 && past + rows <= c.max_seq_len,
                 "sequence " << sq << " of the batch: " << rows << " new tokens after " << past
                             << " (max_seq_len " << c.max_seq_len << ")");
    for (int64_t r = b.cache_rows[sq]; r < b.cache_rows[sq + 1]; ++r)
      CLEAVE_CHECK(b.positions[size_t(r)] == past + r - b.cache_rows[sq],
                   "row " << r << " of the batch is at position " << b.positions[size_t(r)]
                          << ", not the next of sequence " << sq);
    const std::span<const int32_t> table = b.cache_blocks[sq];
    const int64_t need = (past + rows + pool.block_rows() - 1) / pool.block_rows();
    CLEAVE_CHECK(int64_t(table.size()) >= need,
                 "sequence " << sq << " of the batch reaches token " << past + rows << " with "
                             << table.size() << " blocks of " << pool.block_rows() << " tokens");
    for (int64_t i = 0; i < need; ++i)
      CLEAVE_CHECK(table[size_t(i)] >= 0 && table[size_t(i)] < pool.blocks() &&
                       pool.refs(table[size_t(i)]) > 0,
                   "sequence " << sq << " of the batch lists block " << table[size_t(i)]
                               << ", not one in use in a pool of " << pool.blocks());
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i)
    CLEAVE_CHECK(b.logit_rows[i] >= 0 && b.logit_rows[i] < b.T &&
                     (i == 0 || b.logit_rows[i] > b.logit_rows[i - 1]),
                 "logits asked of row " << b.logit_rows[i] << " (entry " << i << ") of a batch of "
                                        << b.T << " rows: rows increase, each inside the batch");
}

// While it lives, every linear of the store runs row-invariant products (a row's logits must not
// depend on the batch: LinearGemm::set_row_invariant); training's products are left as they were.
class RowInvariantProducts {
 public:
  explicit RowInvariantProducts(const ParamStore& store) : store_(store) {
    try {
      set(true);
    } catch (...) {
      set(false);
      throw;
    }
  }
  ~RowInvariantProducts() { set(false); }
  RowInvariantProducts(const RowInvariantProducts&) = delete;
  RowInvariantProducts& operator=(const RowInvariantProducts&) = delete;

 private:
  void set(bool on) {
    for (int i = 0; i < int(store_.tensors().size()); ++i)
      if (LinearGemm* g = store_.packed_by(i)) g->set_row_invariant(on);
  }
  const ParamStore& store_;
};

}  // namespace

KvPool Transformer::new_pool(int64_t blocks, int64_t block_rows, KvDtype dtype) const {
  CLEAVE_CHECK(!blocks_.empty(), "a key/value pool for a rank that holds no layer");
  return KvPool(int(blocks_.size()), int64_t(share_.kv_heads) * cfg_.head_dim(), block_rows, blocks,
                dtype);
}

int64_t Transformer::kv_bytes_per_token(KvDtype dtype) const {
  return 2 * int64_t(blocks_.size()) * share_.kv_heads * cfg_.head_dim() * kv_dtype_bytes(dtype);
}

const float* Transformer::forward_cached(const Batch& batch, KvPool& pool) {
  CLEAVE_CHECK(chunks_.size() == 1, "forward_cached runs one pipeline stage a rank; this rank holds "
                                         << chunks_.size());
  const ModelChunk& chunk = chunks_[0];
  CLEAVE_CHECK((chunk.embedding && chunk.head) || stage_link_,
               "forward_cached on a pipeline stage without the link to the other stages");
  CLEAVE_CHECK(!tp_.sequence_parallel, "inference runs without sequence parallelism");
  CLEAVE_CHECK(batch.cached() && batch.B == 1 && batch.T > 0,
               "forward_cached takes a ragged batch (B = 1, Batch::cached), not " << batch.B
                   << " x " << batch.T);
  CLEAVE_CHECK(pool.layers() == int(blocks_.size()) && pool.row() == int64_t(share_.kv_heads) * cfg_.head_dim(),
               "a key/value pool of " << pool.layers() << " layers of " << pool.row()
                   << " floats for a model of " << blocks_.size() << " layers of "
                   << int64_t(share_.kv_heads) * cfg_.head_dim());
  check_ragged(batch, pool, cfg_);
  size_slots(1, batch.T, {1});
  const int64_t rows = batch.T * cfg_.d_model;
  if (!chunk.embedding) stage_link_->receive(chunk_input(0, 0), rows);
  pool_ = &pool;
  {
    const RowInvariantProducts invariant(store_);
    for (int u = 0; u < n_units(); ++u) forward_unit(u, 0, batch, 0.0f);
  }
  pool_ = nullptr;
  if (!chunk.head) stage_link_->send(chunk_output(0, 0), rows);
  const int64_t R = int64_t(batch.logit_rows.size()), V = cfg_.vocab_size;
  if (chunk.head && chunk.embedding) return tp_.comm ? logits_full_.data() : head_slot(0).logits.data();
  // Pipeline stages: the last one's whole rows reach every stage.
  float* logits = logits_full_.grow(std::max<int64_t>(R, 1) * V);
  if (chunk.head && !tp_.comm) std::memcpy(logits, head_slot(0).logits.data(), R * V * sizeof(float));
  stage_link_->share_logits(logits, R * V);
  return logits;
}

void Transformer::head_logit_rows(Slot& s, const Batch& batch) {
  const int64_t d = cfg_.d_model, R = int64_t(batch.logit_rows.size());
  logit_in_.grow(std::max<int64_t>(R, 1) * d);
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(logit_in_.data() + i * d, s.stream.back().data() + batch.logit_rows[size_t(i)] * d,
                d * sizeof(float));
  if (R == 0) return;
  final_norm_->forward(s.hf.data(), logit_in_.data(), R, s.final_norm);
  head_gemm_->forward(s.logits.data(), s.hf.data(), R, nullptr, &s.head_x);
  if (!tp_.comm) return;
  // Each tp rank has its rows of the vocabulary (vocab_rows columns of logits, the last shard's
  // tail padding): every rank gathers all of them into whole rows, so that every rank draws the
  // same token.
  const int64_t V = share_.vocab_rows, tp = tp_.size();
  logit_parts_.grow(tp * R * V);
  logits_full_.grow(R * cfg_.vocab_size);
  tp_.comm->all_gather(s.logits.data(), logit_parts_.data(), R * V)();
  for (int r = 0; r < int(tp); ++r) {
    const TpShare part = tp_share(cfg_, int(tp), r);
    for (int64_t i = 0; i < R; ++i)
      std::memcpy(logits_full_.data() + i * cfg_.vocab_size + part.vocab_begin,
                  logit_parts_.data() + (r * R + i) * V, part.vocab_real * sizeof(float));
  }
}

}  // namespace cleave
