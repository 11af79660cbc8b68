// Attention between SelfAttention's q|k|v projection and its output projection, through one
// interface: the blockwise kernel over the rank's whole sequences (LocalAttention), or context
// parallelism's exchanges over the cp ranks (ContextAttention, model/context_attention.h).
// make_attention_core picks one at construction and SelfAttention never asks which. Inference
// over a paged key/value cache (model/kv_pool.h) is SelfAttention's attend_cached, through the
// same kernel's paged form.
#pragma once
#include <cstdint>
#include <memory>

#include "cleave/base/buffer.h"
#include "cleave/model/cp_comm.h"
#include "cleave/model/spare_buffers.h"

namespace cleave {

class AttentionCore {
 public:
  // What one micro-batch's forward keeps for its backward, of the implementation's kind.
  struct Saved {
    virtual ~Saved() = default;
    virtual void release() = 0;
  };
  // The micro-batch: B sequences of T rows on this rank; the rows' document ids and the whole
  // sequences' (under cp), or null (one document per sequence).
  struct Rows {
    int64_t B = 0, T = 0;
    const int32_t* documents = nullptr;
    const int32_t* sequence_documents = nullptr;
  };

  virtual ~AttentionCore() = default;
  virtual std::unique_ptr<Saved> new_saved() const = 0;
  // s's buffers for N rows from the spares, and all of them given back (full recompute).
  virtual void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const = 0;
  virtual void give_all(Saved& s, RecomputeSpares& spares) const = 0;
  // o [N, heads * head_dim] (=) from qkv [N, (heads + 2 kv_heads) * head_dim], after RoPE.
  virtual void forward(Saved& s, float* o, const float* qkv, const Rows& rows) = 0;
  // Whether backward reads the qkv given to forward (else the caller may free it).
  virtual bool reads_qkv() const { return true; }
  // The bytes forward keeps for N of this rank's rows (model/saved_bytes.h).
  virtual int64_t saved_bytes(int64_t N) const = 0;
  // d_qkv (=) from d_o, given what forward kept and its qkv and o.
  virtual void backward(Saved& s, float* d_qkv, const float* d_o, const float* qkv,
                        const float* o, const Rows& rows) = 0;
};

// The rank's attention over heads, kv_heads of head_dim: context-parallel where cp is enabled.
std::unique_ptr<AttentionCore> make_attention_core(const ContextParallelOptions& cp, int heads,
                                                   int kv_heads, int head_dim);

}  // namespace cleave
