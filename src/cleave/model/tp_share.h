// Tensor parallelism as the model sees it (docs/tensor_parallel.md): the share of heads, hidden
// units and vocabulary one tp rank holds, and the vocabulary-parallel loss. The tp group is
// model/tp_comm.h, the collectives between regions model/tp_pairs.h.
#pragma once
#include <cstdint>
#include <string>

#include "cleave/model/model_config.h"
#include "cleave/model/placement.h"
#include "cleave/model/tp_comm.h"

namespace cleave {

// What one tp rank holds of a model of config c.
struct TpShare {
  int tp = 1, rank = 0;
  int heads = 0;         // query heads
  int kv_heads = 0;      // key/value heads held (1 when they are replicated)
  int first_kv_head = 0;
  bool kv_replicated = false;  // tp > n_kv_heads: each kv head on tp / n_kv_heads ranks
  int ffn = 0;           // hidden units of the MLP
  int64_t vocab_rows = 0;   // rows of the vocabulary shard (padded: ceil(vocab / tp))
  int64_t vocab_begin = 0;  // its first global row
  int64_t vocab_real = 0;   // rows of it that are real tokens (the rest is padding)
  int qkv_dim(int head_dim) const { return (heads + 2 * kv_heads) * head_dim; }
};
// Throws cleave::Error naming the numbers when c cannot be split over tp ranks.
TpShare tp_share(const ModelConfig& c, int tp, int rank);

// A row-parallel weight [out, in_global] of which the rank holds in_local input columns, the
// rank's block of them (none at tp = 1: the whole tensor).
Placement row_parallel(const TpShare& s, int64_t out, int64_t in_global, int64_t in_local);

// Vocabulary-parallel cross-entropy (Megatron's): `logits` [N, share.vocab_rows] are this rank's
// columns of the vocabulary, from share.vocab_begin, the last vocab_rows - vocab_real padding.
// Each rank's (max, sum-exp, target logit) per token, one all-gather, and each rank finishes the
// loss (losses[i], the same on every rank) and, when grad_scale != 0, its columns' gradient in
// place. The full logits never move. stats and all_stats are scratch of 3 N and 3 N tp floats.
// Placement check mode fails when every rank holds the same logits (Replicate, e.g. gathered,
// where the loss expects Shard(vocab)): the loss would then count every column tp times (log(tp)
// on the sum-exp).
void vocab_parallel_cross_entropy(const TensorParallelOptions& tp, const TpShare& share,
                                  int vocab_size, float* logits, float* losses,
                                  const int32_t* targets, int64_t N, float grad_scale,
                                  float* stats, float* all_stats);

}  // namespace cleave
