// Tensor parallelism as the model sees it (docs/tensor_parallel.md): the tp group behind an
// interface (the model does not link MPI; parallel/tensor_parallel.cpp implements it over a Group),
// Megatron's conjugate pairs of collectives, each a forward and its backward, and the share of
// heads, hidden units and vocabulary one tp rank holds.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "cleave/model/model_config.h"

namespace cleave {

// Collectives over the tp ranks on fp32 rows. Each starts the operation and returns what to call
// to wait for it; the rank's other work runs meanwhile.
class TpComm {
 public:
  using Wait = std::function<void()>;
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Wait all_reduce(float* buf, int64_t n) = 0;
  // recv[r * n ...] = send of rank r.
  virtual Wait all_gather(const float* send, float* recv, int64_t n) = 0;
  // recv (n) = sum over ranks of their send[rank * n ...].
  virtual Wait reduce_scatter(const float* send, float* recv, int64_t n) = 0;
  // Placement check mode (parallel.check_placements): fails naming `what` unless every tp rank
  // holds the same n floats at buf.
  virtual void check_replicated(const float* buf, int64_t n, const std::string& what) = 0;
};

struct TensorParallelOptions {
  TpComm* comm = nullptr;  // null: tp = 1
  bool sequence_parallel = false;
  bool check_placements = false;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

// Megatron's conjugate pairs between the regions of a block (Korthikanti et al. 2022, fig. 5):
// rows are tokens, n the floats of one rank's rows. Each forward's backward is its conjugate.
namespace tp_pairs {
// identity / all-reduce: a replicated input enters a column-parallel linear ("f").
inline void copy_forward() {}
inline TpComm::Wait copy_backward(TpComm& c, float* dx, int64_t n) { return c.all_reduce(dx, n); }
// all-reduce / identity: a row-parallel linear's partial sums leave it ("g").
inline TpComm::Wait reduce_forward(TpComm& c, float* y, int64_t n) { return c.all_reduce(y, n); }
inline void reduce_backward() {}
// all-gather / reduce-scatter: the sequence-parallel rows enter a column-parallel linear.
inline TpComm::Wait gather_forward(TpComm& c, const float* x_local, float* x_full, int64_t n) {
  return c.all_gather(x_local, x_full, n);
}
inline TpComm::Wait gather_backward(TpComm& c, const float* dx_full, float* dx_local, int64_t n) {
  return c.reduce_scatter(dx_full, dx_local, n);
}
// reduce-scatter / all-gather: a row-parallel linear's partial sums leave as sequence shards.
inline TpComm::Wait scatter_forward(TpComm& c, const float* y_full, float* y_local, int64_t n) {
  return c.reduce_scatter(y_full, y_local, n);
}
inline TpComm::Wait scatter_backward(TpComm& c, const float* dy_local, float* dy_full, int64_t n) {
  return c.all_gather(dy_local, dy_full, n);
}
}  // namespace tp_pairs

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
