#include "cleave/model/attention_core.h"

#include "cleave/kernels/attention.h"
#include "cleave/model/context_attention.h"
#include "cleave/model/saved_bytes.h"

namespace cleave {

namespace {

// The blockwise kernel over the rank's whole sequences, keeping each row's log-sum-exp.
class LocalAttention final : public AttentionCore {
 public:
  LocalAttention(int heads, int kv_heads, int head_dim)
      : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {}

  struct Saved final : AttentionCore::Saved {
    Buffer<float> lse;
    void release() override { lse = Buffer<float>(); }
  };
  std::unique_ptr<AttentionCore::Saved> new_saved() const override {
    return std::make_unique<Saved>();
  }
  void take_spares(AttentionCore::Saved& s, RecomputeSpares& spares, int64_t N) const override {
    spares.floats.fill(mine(s).lse, N * heads_);
  }
  void give_all(AttentionCore::Saved& s, RecomputeSpares& spares) const override {
    spares.floats.give(mine(s).lse);
  }
  int64_t saved_bytes(int64_t N) const override { return N * heads_ * kFloatBytes; }
  void forward(AttentionCore::Saved& s, float* o, const float* qkv, const Rows& rows) override {
    Buffer<float>& lse = mine(s).lse;
    lse.fit(rows.B * rows.T * heads_);  // fitted, not resized: a resize maps fresh pages
    kernels::attention_forward(o, lse.data(), qkv, qkv + q_dim(), qkv + q_dim() + kv_dim(),
                               shape(rows));
  }
  void backward(AttentionCore::Saved& s, float* d_qkv, const float* d_o, const float* qkv,
                const float* o, const Rows& rows) override {
    kernels::attention_backward(d_qkv, d_qkv + q_dim(), d_qkv + q_dim() + kv_dim(), d_o, qkv,
                                qkv + q_dim(), qkv + q_dim() + kv_dim(), o, mine(s).lse.data(),
                                shape(rows));
  }

 private:
  static Saved& mine(AttentionCore::Saved& s) { return static_cast<Saved&>(s); }
  int64_t q_dim() const { return int64_t(heads_) * head_dim_; }
  int64_t kv_dim() const { return int64_t(kv_heads_) * head_dim_; }
  kernels::AttentionShape shape(const Rows& rows) const {
    const int64_t qkv_dim = q_dim() + 2 * kv_dim();
    kernels::AttentionShape shape{rows.B, rows.T, heads_, kv_heads_, head_dim_, qkv_dim, qkv_dim};
    shape.q_seq = shape.k_seq = rows.documents;
    return shape;
  }

  int heads_, kv_heads_, head_dim_;
};

}  // namespace

std::unique_ptr<AttentionCore> make_attention_core(const ContextParallelOptions& cp, int heads,
                                                   int kv_heads, int head_dim) {
  if (cp.enabled()) return std::make_unique<ContextAttention>(cp, heads, kv_heads, head_dim);
  return std::make_unique<LocalAttention>(heads, kv_heads, head_dim);
}

}  // namespace cleave
