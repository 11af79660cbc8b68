// Deterministic batches: sample i of step s is the window of seq_len+1 tokens starting at an offset
// drawn from Philox keyed by (seed, split, step, i). A data-parallel rank asks for its slice of the
// global sample indices and gets exactly the rows the single-process run would use.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/data/tokens.h"

namespace cleave {

class BatchLoader {
 public:
  // split_id separates the train and validation streams (0 = train, 1 = validation).
  BatchLoader(const TokenShard& shard, int64_t seq_len, uint64_t seed, uint64_t split_id);
  // Fills inputs and targets ([count, seq_len] each, int32) with global samples
  // [first_sample, first_sample + count) of step `step`.
  void fill(int32_t* inputs, int32_t* targets, uint64_t step, int64_t first_sample,
            int64_t count) const;
  // The same samples as a batch descriptor: each window is one sequence (positions 0 .. seq_len-1,
  // one document), and every target counts.
  void fill(Batch& batch, uint64_t step, int64_t first_sample, int64_t count) const;

 private:
  const TokenShard& shard_;
  int64_t seq_len_;
  uint64_t seed_, split_id_;
};

}  // namespace cleave
