#include "cleave/model/feed_forward.h"

namespace cleave {

namespace {

// An implementation's Saved, as FeedForward::Saved.
template <class Module>
struct SavedOf final : FeedForward::Saved {
  typename Module::Saved s;
  void release() override { s.release(); }
};

template <class Module>
typename Module::Saved& saved(FeedForward::Saved& s) {
  return static_cast<SavedOf<Module>&>(s).s;
}

// What both kinds do alike: the rest of the interface on the module's own Saved and scratch.
template <class Module, typename Module::Scratch FeedForwardScratch::*scratch>
class Adapter : public FeedForward {
 public:
  template <class... Args>
  explicit Adapter(Args&&... args) : m_(std::forward<Args>(args)...) {}
  std::unique_ptr<Saved> new_saved() const override { return std::make_unique<SavedOf<Module>>(); }
  void bind(ParamStore& store) override { m_.bind(store); }
  void reserve(FeedForwardScratch& g, int64_t N) const override { m_.reserve(g.*scratch, N); }
  void add_bias(float* y, int64_t rows) const override { m_.add_bias(y, rows); }
  void backward_input(Saved& s, FeedForwardScratch& g, float* dx, const float* dy,
                      bool defer) override {
    m_.backward_input(saved<Module>(s), g.*scratch, dx, dy, defer);
  }
  void backward_weight(Saved& s, const float* x) override {
    m_.backward_weight(saved<Module>(s), x);
  }
  void release_activation(Saved& s, RecomputeSpares& spares) const override {
    m_.release_activation(saved<Module>(s), spares);
  }
  void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const override {
    m_.take_spares(saved<Module>(s), spares, N);
  }
  void give_all(Saved& s, RecomputeSpares& spares) const override {
    m_.give_all(saved<Module>(s), spares);
  }
  void recompute_activation(Saved& s, const float* x) override {
    m_.recompute_activation(saved<Module>(s), x);
  }
  SavedBytes saved_bytes(int64_t rows, bool keep_x) const override {
    return m_.saved_bytes(rows, keep_x);
  }

 protected:
  Module m_;
};

class DenseFeedForward final : public Adapter<Mlp, &FeedForwardScratch::mlp> {
 public:
  using Adapter::Adapter;
  void forward(Saved& s, FeedForwardScratch&, float* y, const float* x,
               const Call& call) override {
    m_.forward(saved<Mlp>(s), y, x, call.rows, call.keep_x);
  }
};

class MoeFeedForward final : public Adapter<Moe, &FeedForwardScratch::moe> {
 public:
  using Adapter::Adapter;
  void forward(Saved& s, FeedForwardScratch& g, float* y, const float* x,
               const Call& call) override {
    m_.forward(saved<Moe>(s), g.moe, y, x, call.batch, call.keep_x, call.grad_scale,
               call.count_stats, call.generating);
  }
  Moe* moe() override { return &m_; }
};

}  // namespace

std::unique_ptr<FeedForward> make_feed_forward(ParamStore& store, const std::string& block,
                                               int layer, const ModelConfig& c,
                                               const TpShare& share, Precision precision,
                                               const TensorParallelOptions& tp,
                                               const MoeOptions& moe) {
  if (c.is_moe_layer(layer))
    return std::make_unique<MoeFeedForward>(store, block + ".moe", layer, c, share, precision, tp,
                                            moe);
  return std::make_unique<DenseFeedForward>(store, block + ".mlp", c, share, precision);
}

}  // namespace cleave
