// Deterministic batches: sample i of step s is the window of seq_len+1 tokens starting at an offset
// drawn from Philox keyed by (seed, split, step, i). A data-parallel rank asks for its slice of the
// global sample indices and gets exactly the rows the single-process run would use.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/data/tokens.h"

namespace cleave {

// Documents inside a window: token files hold documents one after the other, each ended by a
// separator (the end-of-text id `cleave tokenize` writes, 2). With mask, the batch says which
// document each token is in (the separator belongs to the one it ends), and attention stays
// inside it; with reset_positions, positions restart at 0 after each separator.
struct DocumentOptions {
  bool mask = false;
  bool reset_positions = false;
  int32_t separator = 2;
};

// Context parallelism's deal (docs/context_parallel.md): each window is cut into 2 x cp chunks
// and cp rank r takes chunks r and 2cp-1-r, so that every rank does the same causal work.
struct ContextSplit {
  int cp = 1, rank = 0;
};

class BatchLoader {
 public:
  // split_id separates the train and validation streams (0 = train, 1 = validation).
  BatchLoader(const TokenShard& shard, int64_t seq_len, uint64_t seed, uint64_t split_id,
              DocumentOptions documents = {}, ContextSplit split = {});
  // Fills inputs and targets ([count, seq_len] each, int32) with global samples
  // [first_sample, first_sample + count) of step `step`.
  void fill(int32_t* inputs, int32_t* targets, uint64_t step, int64_t first_sample,
            int64_t count) const;
  // The same samples as a batch descriptor: each window is one sequence, its documents and
  // positions as the DocumentOptions say (by default one document, positions 0 .. seq_len-1),
  // and every target counts. Under context parallelism, this rank's two chunks of each window
  // (T = seq_len / cp tokens per sequence) with their positions in the whole window, and the
  // whole windows' documents in sequence_documents.
  void fill(Batch& batch, uint64_t step, int64_t first_sample, int64_t count) const;

 private:
  void fill_whole(Batch& batch, uint64_t step, int64_t first_sample, int64_t count) const;

  const TokenShard& shard_;
  int64_t seq_len_;
  uint64_t seed_, split_id_;
  DocumentOptions documents_;
  ContextSplit split_;
  mutable Batch whole_;  // the whole windows, under context parallelism
};

}  // namespace cleave
