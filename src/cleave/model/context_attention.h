// Attention over a sequence cut across the cp ranks (docs/context_parallel.md), the part of
// SelfAttention that context parallelism replaces: given this rank's q, k and v rows (its two
// zigzag chunks of each sequence, after RoPE), the attention output of those rows over the whole
// sequence, always through the blockwise kernel (no T x T matrix in any mode).
//   ring: chunk pair by chunk pair as K|V rows arrive, a query chunk meeting only the key chunks
//     at or before it, the partial results merged by their log-sum-exp.
//   allgather: every rank's K|V rows in sequence order; each query chunk one kernel call over
//     every key before its end.
//   ulysses: an all-to-all turns the rank's rows of every head into the whole sequence of a
//     share of the heads, one causal attention as in one process, and the output goes back.
//   hybrid: that all-to-all over a Ulysses group, then the ring over the ranks holding the same
//     heads (their Ulysses groups' chunks), and back.
#pragma once
#include <cstdint>
#include <memory>

#include "cleave/base/buffer.h"
#include "cleave/kernels/attention.h"
#include "cleave/model/attention_core.h"
#include "cleave/model/cp_comm.h"

namespace cleave {

// The exchanges' work buffers, alive within one call: one set for every layer of a model.
struct ContextWork {
  Buffer<float> kv, kv_next, dkv, dkv_next, dkv_part;  // K|V rows and their gradients in flight
  Buffer<float> out_part, lse_part;                    // one chunk pair's result, to merge
  Buffer<float> out;  // Ulysses and hybrid: the output in attention's layout
  // Rows reordered (Ulysses, allgather), gradients, and the all-to-alls' staging, by turns.
  Buffer<float> rows, grads;
};

class ContextAttention final : public AttentionCore {
 public:
  // One micro-batch's, kept from forward for backward.
  struct Saved final : AttentionCore::Saved {
    // Ulysses and hybrid: q|k|v of this rank's heads over its group's rows (in sequence order
    // under ulysses). Their output is not kept: backward gets it again from the rank's rows.
    Buffer<float> qkv_u;
    // Per (group member, sequence, chunk): [heads, chunk rows]; under ulysses [B, heads, T x cp].
    Buffer<float> lse;
    void release() override;
  };

  // heads, kv_heads: this rank's (its tp share), which Ulysses must be able to split (the layout
  // checks it first). The work buffers are options.work's (made here when null).
  ContextAttention(const ContextParallelOptions& options, int heads, int kv_heads, int head_dim);

  // o [B*T, heads*head_dim] (=) from qkv [B*T, (heads + 2 kv_heads) * head_dim] (q | k | v per
  // row), this rank's T = 2 chunks of each of B sequences. documents: the whole sequences'
  // document ids [B * T * cp], or null (one document per sequence).
  // (AttentionCore: rows.sequence_documents are those.) Its buffers come from no spares.
  std::unique_ptr<AttentionCore::Saved> new_saved() const override {
    return std::make_unique<Saved>();
  }
  void take_spares(AttentionCore::Saved&, RecomputeSpares&, int64_t) const override {}
  void give_all(AttentionCore::Saved&, RecomputeSpares&) const override {}
  void forward(AttentionCore::Saved& s, float* o, const float* qkv, const Rows& rows) override;
  // Whether backward reads the qkv given to forward (under ulysses and hybrid it keeps its own).
  bool reads_qkv() const override { return U_ == 1; }
  int64_t saved_bytes(int64_t N) const override;
  // d_qkv (=) from d_o, given what forward kept and its qkv and o.
  void backward(AttentionCore::Saved& s, float* d_qkv, const float* d_o, const float* qkv,
                const float* o, const Rows& rows) override;

 private:
  struct Geometry;
  Geometry geometry(int64_t B, int64_t T) const;
  // One chunk of query rows (in A) over one chunk of K|V rows (K then V in each row).
  kernels::AttentionShape chunk_shape(const Geometry& g) const;
  // Query chunk qc of sequence b over every key before its end, the K|V rows in sequence order.
  kernels::AttentionShape prefix_shape(const Geometry& g, int64_t qc, int64_t b,
                                       const int32_t* documents) const;
  template <class F>
  void for_each_pair(const Geometry& g, int owner, const int32_t* documents, F&& f) const;
  // Ring (and hybrid): the attention of every query chunk of this rank's rows A over the key
  // chunks of the K|V rows kv of ring position `owner`, merged into O and lse; or, in backward,
  // their gradients (+=) into dA and dkv.
  void pairs_forward(const Geometry& g, const float* A, float* O, float* lse, const float* kv,
                     int owner, const int32_t* documents);
  void pairs_backward(const Geometry& g, const float* A, float* dA, const float* O,
                      const float* lse, const float* dO, const float* kv, float* dkv, int owner,
                      const int32_t* documents);
  // Allgather: every rank's K|V rows, in sequence order, into work->rows.
  void gather_kv(const Geometry& g, const float* A);
  void pack_kv(const Geometry& g, float* kv, const float* A) const;     // A's K|V columns
  void unpack_kv(const Geometry& g, float* dA, const float* dkv) const;  // into dA's K|V columns
  // Rows of `members` cp ranks (member m is cp rank m: ulysses, allgather), member by member,
  // into sequence order, or back.
  void permute(const Geometry& g, float* dst, const float* src, int64_t cols, int members,
               bool to_global) const;
  // Ulysses' all-to-all: qkv rows of every head -> the group's rows of this rank's heads; back.
  // The staging buffer is one of the work buffers the caller is not using at that point.
  void scatter_heads(const Geometry& g, float* A, const float* qkv, int64_t cols_q, int64_t cols_kv,
                     Buffer<float>& send);
  void gather_heads(const Geometry& g, float* qkv, const float* A, int64_t cols_q, int64_t cols_kv,
                    bool sum_kv, Buffer<float>& recv);
  int kv_first(int member) const;  // the first kv head a Ulysses member computes with

  ContextParallelOptions opt_;
  int heads_, kv_heads_, head_dim_;
  int U_, R_;                 // Ulysses group size, ring size (R_ * U_ = cp)
  int heads_u_, kv_heads_u_;  // per Ulysses member
  bool kv_split_;             // kv heads split over the Ulysses group (else replicated)
};

}  // namespace cleave
