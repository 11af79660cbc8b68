#include "cleave/model/tp_share.h"

#include <algorithm>

#include "cleave/base/check.h"
#include "cleave/kernels/cross_entropy.h"

namespace cleave {

Placement row_parallel(const TpShare& s, int64_t out, int64_t in_global, int64_t in_local) {
  if (s.tp == 1) return {};
  return shard_cols({out, in_global}, s.rank * in_local, in_local);
}

TpShare tp_share(const ModelConfig& c, int tp, int rank) {
  const std::string split = " over parallel.tp = " + std::to_string(tp);
  if (c.n_heads % tp != 0)
    throw Error("model.n_heads = " + std::to_string(c.n_heads) + " cannot be split" + split +
                ": n_heads must be divisible by tp");
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
    throw Error("model.n_kv_heads = " + std::to_string(c.n_kv_heads) + " cannot be split" + split +
                ": n_kv_heads must be divisible by tp (kv heads split) or divide tp (kv heads "
                "replicated)");
  if (c.ffn_hidden % tp != 0)
    throw Error("model.ffn_hidden = " + std::to_string(c.ffn_hidden) + " cannot be split" + split +
                ": ffn_hidden must be divisible by tp");
  if (c.moe_experts > 0 && c.moe_ffn_hidden % tp != 0)
    throw Error("model.moe_ffn_hidden = " + std::to_string(c.moe_ffn_hidden) + " cannot be split" +
                split + ": each expert's hidden units must be divisible by tp");
  TpShare s;
  s.tp = tp;
  s.rank = rank;
  s.heads = c.n_heads / tp;
  s.kv_replicated = c.n_kv_heads % tp != 0;
  s.kv_heads = s.kv_replicated ? 1 : c.n_kv_heads / tp;
  s.first_kv_head = s.kv_replicated ? rank / (tp / c.n_kv_heads) : rank * s.kv_heads;
  s.ffn = c.ffn_hidden / tp;
  s.vocab_rows = (int64_t(c.vocab_size) + tp - 1) / tp;
  s.vocab_begin = rank * s.vocab_rows;
  s.vocab_real = std::clamp<int64_t>(c.vocab_size - s.vocab_begin, 0, s.vocab_rows);
  return s;
}

void vocab_parallel_cross_entropy(const TensorParallelOptions& tp, const TpShare& share,
                                  int vocab_size, float* logits, float* losses,
                                  const int32_t* targets, int64_t N, float grad_scale,
                                  float* stats, float* all_stats) {
  for (int64_t i = 0; i < N; ++i)
    CLEAVE_CHECK(targets[i] >= 0 && targets[i] < vocab_size,
                 "target of row " << i << " is " << targets[i] << ", outside [0, " << vocab_size
                                  << ")");
  const int V = int(share.vocab_real);
  const int64_t stride = share.vocab_rows;
  kernels::vocab_shard_stats(logits, stats, targets, N, V, stride, share.vocab_begin);
  tp.comm->all_gather(stats, all_stats, 3 * N)();
  if (tp.check_placements && tp.size() > 1) {
    bool same = true;
    for (int r = 1; r < tp.size() && same; ++r)
      for (int64_t i = 0; i < N && same; ++i)
        same = all_stats[3 * (r * N + i)] == all_stats[3 * i] &&
               all_stats[3 * (r * N + i) + 1] == all_stats[3 * i + 1];
    if (same)
      throw Error("placement check: vocab-parallel cross-entropy: its logits are Replicate on tp "
                  "(every tp rank holds the same values), and it expects Shard(vocab) (each rank "
                  "its own columns of the vocabulary): with gathered logits every column would count " +
                  std::to_string(tp.size()) + " times");
  }
  kernels::vocab_shard_loss(logits, losses, all_stats, tp.size(), targets, N, V, stride,
                            share.vocab_begin, grad_scale);
}

}  // namespace cleave
