// One micro-batch as a rank holds it, the descriptor that travels through the step: B sequences
// of T tokens each (a whole sequence, or this rank's piece of it), with what the model needs to
// know of every token beside its id. Embeddings and RoPE read each token's position from it,
// attention its document, the loss its mask; nothing infers them from a token's index.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace cleave {

struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;  // [B * T]
  std::vector<int32_t> positions;        // [B * T]: the token's position in its sequence
  // [B * T]: the document the token belongs to, non-decreasing along a sequence; attention never
  // crosses documents. Empty: each sequence is one document.
  std::vector<int32_t> documents;
  // Under context parallelism (docs/context_parallel.md) each sequence of T * cp tokens is cut
  // into 2 x cp chunks and a rank holds two of them (T tokens): attention reads the documents of
  // every chunk from here, [B * T * cp]. Empty when documents is, and at cp 1.
  std::vector<int32_t> sequence_documents;
  std::vector<uint8_t> loss_mask;  // [B * T]: 1 where the token's loss counts
  int64_t valid_tokens = 0;        // tokens whose loss counts

  // Inference over a paged key/value cache (model/kv_pool.h, docs/inference.md): B = 1 and the T
  // tokens are the new tokens of several sequences one after another, a ragged batch. Sequence s
  // has rows [cache_rows[s], cache_rows[s + 1]), following the cache_past[s] tokens its blocks
  // hold already (positions go on from there); cache_blocks[s] is its block table, with room for
  // both. Empty: no cache (training).
  std::vector<int64_t> cache_rows, cache_past;
  std::vector<std::span<const int32_t>> cache_blocks;
  // Inference: the rows whose logits the head computes, increasing; no loss is computed.
  std::vector<int64_t> logit_rows;
  bool cached() const { return !cache_past.empty(); }

  void resize(int64_t b, int64_t t) {
    B = b, T = t;
    const size_t n = size_t(b * t);
    tokens.resize(n);
    targets.resize(n);
    positions.resize(n);
    loss_mask.resize(n);
  }
  // B x T tokens as B whole sequences: positions 0 .. T-1, one document each, every target
  // counting.
  void whole_sequences(int64_t b, int64_t t) {
    resize(b, t);
    for (int64_t i = 0; i < b * t; ++i) positions[size_t(i)] = int32_t(i % t);
    documents.clear();
    sequence_documents.clear();
    cache_rows.clear();
    cache_past.clear();
    cache_blocks.clear();
    logit_rows.clear();
    std::fill(loss_mask.begin(), loss_mask.end(), uint8_t(1));
    valid_tokens = b * t;
  }
};

}  // namespace cleave
