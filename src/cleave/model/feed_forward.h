// A block's feed-forward module through one interface: the dense MLP (model/mlp.h) or a mixture of
// experts (model/moe.h), which make_feed_forward picks per layer. The block runs it without
// asking which, so a third kind is an implementation here and in feed_forward.cpp, and no block
// code.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "cleave/base/batch.h"
#include "cleave/model/mlp.h"
#include "cleave/model/moe.h"
#include "cleave/model/spare_buffers.h"

namespace cleave {

// Scratch the blocks of a model share (one per kind): the gradients inside one backward.
struct FeedForwardScratch {
  Mlp::Scratch mlp;
  Moe::Scratch moe;
};

class FeedForward {
 public:
  // What one micro-batch's forward keeps for its backward, of the implementation's kind.
  struct Saved {
    virtual ~Saved() = default;
    virtual void release() = 0;  // everything: a forward on the same input rebuilds it
  };
  // One forward: the micro-batch (the module sees `rows` of it: every tp rank's), whether x is
  // kept for the weight gradients, the loss's scale for a mixture's balancing terms, whether it
  // counts the routing statistics, and generation through a cache (a mixture then ignores its
  // capacity, seeing a few new tokens at a time).
  struct Call {
    const Batch& batch;
    int64_t rows = 0;
    bool keep_x = true;
    float grad_scale = 0;
    bool count_stats = false;
    bool generating = false;
  };

  virtual ~FeedForward() = default;
  virtual std::unique_ptr<Saved> new_saved() const = 0;
  virtual void bind(ParamStore& store) = 0;
  virtual void reserve(FeedForwardScratch& g, int64_t N) const = 0;
  // y (=) a partial sum over tp of the module's output for x; add_bias adds what the rank's rows
  // of the sum lack.
  virtual void forward(Saved& s, FeedForwardScratch& g, float* y, const float* x,
                       const Call& call) = 0;
  virtual void add_bias(float* y, int64_t rows) const = 0;
  virtual void backward_input(Saved& s, FeedForwardScratch& g, float* dx, const float* dy,
                              bool defer) = 0;
  virtual void backward_weight(Saved& s, const float* x) = 0;
  // Activation checkpointing: selective gives the cheap activation and rebuilds it from x; full
  // gives every buffer; take_spares sizes s's buffers for N rows from the spares.
  virtual void release_activation(Saved& s, RecomputeSpares& spares) const = 0;
  virtual void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const = 0;
  virtual void give_all(Saved& s, RecomputeSpares& spares) const = 0;
  virtual void recompute_activation(Saved& s, const float* x) = 0;
  // What forward keeps for `rows` tokens (model/saved_bytes.h); a mixture's experts counted
  // with balanced routing.
  virtual SavedBytes saved_bytes(int64_t rows, bool keep_x) const = 0;
  // The mixture of experts behind it, for the model's routing statistics and router biases;
  // null for a dense MLP.
  virtual Moe* moe() { return nullptr; }
};

// Layer `layer`'s module of block `block` ("blocks.L"): a mixture of experts (BLOCK.moe) where
// the config makes the layer one, else the MLP (BLOCK.mlp).
std::unique_ptr<FeedForward> make_feed_forward(ParamStore& store, const std::string& block,
                                               int layer, const ModelConfig& c,
                                               const TpShare& share, Precision precision,
                                               const TensorParallelOptions& tp,
                                               const MoeOptions& moe);

}  // namespace cleave
