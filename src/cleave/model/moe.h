// A mixture-of-experts layer in place of a block's MLP (docs/moe.md), with the MLP's interface
// (forward, backward_input, backward_weight, a Saved per micro-batch the caller owns): a router
// (a linear to E logits, fp32) picks each token's top k experts (kernels/moe_router.h); each
// chosen expert (the family's MLP) runs on the rows routed to it, one product per expert and
// linear over all its rows (grouped GEMMs, never a loop over tokens); the output is the sum of
// the gates times the expert outputs, plus the shared experts' MLP on every token.
//
// Balancing and capacity are per sequence, so that no layout changes them: a sequence's routed
// fractions f_i and mean probabilities P_i give the auxiliary loss coef x E x sum_i f_i P_i
// (Switch/GShard, in DeepSeek-V3's sequence-wise form), averaged over the step's sequences; the
// z-loss is averaged over its tokens. With a capacity factor an expert takes at most
// ceil(factor x T x k / E) of a sequence's T tokens' choices: all first choices in position
// order, then all second choices, and so on (GShard's priority); the rest are dropped.
//
// Tensor parallelism splits every expert as the dense MLP is split (its output a partial sum the
// block completes); the router is replicated and its input gradient added on tp rank 0 only.
// Expert parallelism holds E / ep experts per rank: rows go to their expert's rank and come back
// by all-to-all(v), the shared experts running while they travel.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/base/buffer.h"
#include "cleave/model/cp_comm.h"
#include "cleave/model/saved_bytes.h"
#include "cleave/model/ep_comm.h"
#include "cleave/model/layers.h"
#include "cleave/model/mlp.h"
#include "cleave/model/model_config.h"
#include "cleave/model/spare_buffers.h"
#include "cleave/model/tp_share.h"

namespace cleave {

// What the model's MoE layers need beyond tensor parallelism: the expert group, and the whole
// cp group (its ranks hold the zigzag chunks of the same sequences: model/cp_comm.h),
// over which each sequence's routing counts are gathered.
struct MoeOptions {
  int expert_group = 0;        // the ParamStore group the experts join (the router stays dense)
  EpComm* ep = nullptr;        // null: every expert on this rank
  CpComm* sequence = nullptr;  // null: cp = 1
  int ep_size() const { return ep ? ep->size() : 1; }
  int ep_rank() const { return ep ? ep->rank() : 0; }
  int cp_size() const { return sequence ? sequence->size() : 1; }
  int cp_rank() const { return sequence ? sequence->rank() : 0; }
};

// One layer's routing statistics summed over the micro-batches of a step (forwards that prepare
// a backward; recomputes and validation do not count): choices per expert before capacity, the
// rows each expert kept within it (what ep sends), the choices dropped, and the balancing terms
// as they enter the loss (sums over sequences and tokens: the trainer divides by the step's).
struct MoeLayerStats {
  int layer = 0;
  std::vector<double> tokens;  // per expert (global index)
  std::vector<double> kept;    // per expert: its routed rows
  double dropped = 0, aux = 0, z = 0;
  std::vector<float> bias;  // sigmoid_bias: the bias the step routed with
};

class Moe {
 public:
  struct Saved {
    int64_t N = 0, B = 0, T = 0;
    float grad_scale = 0;
    Buffer<float> logits, gate;        // [N, E], [N, k]
    std::vector<int32_t> choice;       // [N, k]: global expert ids
    std::vector<int64_t> row;          // [N, k]: the choice's row in send order, -1 if dropped
    Buffer<float> fraction;            // [B, E]: each sequence's routed fractions (aux loss)
    // Where the rows went, fixed by the forward's routing; the backward sends along the same.
    struct Routes {
      std::vector<int64_t> send_rows;  // per expert (global): rows this rank sent it
      std::vector<int64_t> recv_rows;  // per (source rank, local expert): rows received
      std::vector<int64_t> begin;      // per local expert, and one past: its first row received
      int64_t sent = 0, received = 0;
      // ep > 1: floats to and from each ep rank, and the regroupings between the received order
      // (by source) and the experts' (by expert): block orders over recv_rows, and the blocks'
      // rows in expert order.
      std::vector<int64_t> to_owners, from_sources;
      std::vector<int> by_expert, by_source;
      std::vector<int64_t> by_expert_rows;
    } routes;
    Buffer<float> y_send;              // [rows sent, d]: the experts' outputs, back in send order
    Buffer<float> x_expert;            // [rows received, d]: by local expert, then source rank
    std::vector<Mlp::Saved> experts;   // per local expert: views of the pools below
    // The experts' activations, one pool per kind, each expert's rows a slice (Buffer::borrow):
    // the rows an expert takes change every step, their sum hardly (N x k at ep 1).
    Buffer<float> pool_fc, pool_act, pool_dy, pool_dfc;
    Buffer<bf16> pool_x_copy, pool_act_copy;
    Mlp::Saved shared;
    bool x_kept = false;
    Buffer<float> d_logits;  // kept by a deferred input half for the router's weight gradient
    const float* d_logits_used = nullptr;  // the router's output gradient, for its weights
    bool experts_pending = false;  // the input half was deferred: the experts' weights wait
    void release();
  };
  struct Scratch {  // shared by every block: the gradients inside one backward
    Mlp::Scratch expert, shared;
    int64_t expert_rows = 0;  // what `expert` is sized for: rows of one expert
    Buffer<float> x_send, y_expert, dy_send, dy_expert, dx_expert, dx_send;
    Buffer<float> probs, d_gate, d_probs, d_logits, counts, gathered_counts;
    std::vector<float> chunk_counts;  // [B, k, chunks, E]: each sequence's choices, by chunk
    Buffer<float> tile_in, tile_out;  // dropless: an expert's rows padded to whole row tiles
  };

  Moe(ParamStore& store, const std::string& name, int layer, const ModelConfig& c,
      const TpShare& share, Precision precision, const TensorParallelOptions& tp,
      const MoeOptions& options);
  void bind(ParamStore& store);
  void reserve(Scratch& g, int64_t N) const;

  // y (=) over the N = batch.B x batch.T rows of x (every tp rank's, as the MLP's input). y is a
  // partial sum over tp, as the MLP's. grad_scale: the loss's, for the balancing terms'
  // gradients; count: add this micro-batch to the statistics; dropless: ignore the capacity
  // (generation through a cache, which sees a few new tokens at a time, as Megatron's inference).
  void forward(Saved& s, Scratch& g, float* y, const float* x, const Batch& batch, bool keep_x,
               float grad_scale, bool count, bool dropless = false);
  void add_bias(float* y, int64_t rows) const;
  void backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer);
  void backward_weight(Saved& s, const float* x);
  // Activation checkpointing, as the MLP's.
  void release_activation(Saved& s, RecomputeSpares& spares) const;
  void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const;
  void give_all(Saved& s, RecomputeSpares& spares) const;
  void recompute_activation(Saved& s, const float* x);
  // A planned model's rows per choice of its N x top_k (Transformer::planned, plan/routing.h):
  // sent, the choices the rank keeps; received, the rows its experts get from every ep rank.
  // Balanced routing, the default: 1 and 1.
  struct PlannedRows {
    double sent = 1, received = 1;
  };
  void plan_rows(PlannedRows rows) { planned_ = rows; }
  // What forward keeps for N tokens (model/saved_bytes.h), the experts' rows as plan_rows gave them.
  SavedBytes saved_bytes(int64_t N, bool keep_x) const;
  // The exchange buffers expert parallelism adds to the scratch every block shares (Scratch's
  // x_send, y_expert, dy_expert and dx_send), for N tokens, the rows as plan_rows gave them.
  int64_t ep_scratch_bytes(int64_t N) const;

  // The step's statistics (then zeroed), and sigmoid_bias's update from the step's global load
  // per expert: each bias moves by the rate toward the mean load, and the biases keep mean zero.
  MoeLayerStats take_stats();
  void update_bias(const std::vector<double>& load);
  std::vector<float>& bias() { return bias_; }
  int layer() const { return layer_; }

 private:
  int local_experts() const { return E_ / opt_.ep_size(); }
  // Chunks of each sequence a rank holds: context parallelism's two zigzag chunks, or one.
  int chunks_per_rank() const { return opt_.cp_size() > 1 ? 2 : 1; }
  // Every sequence's choices per choice rank, chunk and expert, into g.chunk_counts (over the
  // cp ranks: a collective).
  void count_choices(const Saved& s, Scratch& g) const;
  // Drops what exceeds the capacity, per sequence, in priority order; fills s.row (send order)
  // and the rows sent to each expert; returns the choices dropped.
  double assign_rows(Saved& s, const Scratch& g, bool dropless) const;
  // The rest of s.routes, from the rows sent and received.
  void plan_routes(Saved::Routes& r) const;
  // Gives each expert's Saved its slices of s's pools (grown to the rows received): its
  // activations, their bf16 copies (bf16), and with `deferred` the output and fc gradients.
  void lend(Saved& s, bool activations, bool deferred) const;
  void dispatch(Saved& s, Scratch& g, const float* x);
  // dropless (inference): each expert's rows are padded to whole row tiles (kInferenceRowTile),
  // since the products' bits for a row depend on how many rows share the call, and an expert's
  // rows depend on the rest of the batch.
  void run_experts(Saved& s, Scratch& g, bool dropless);
  void combine(Saved& s, float* y) const;

  const ModelConfig& cfg_;
  int layer_, E_, k_;
  Precision precision_;
  TensorParallelOptions tp_;
  MoeOptions opt_;
  Linear router_;
  std::vector<std::unique_ptr<Mlp>> experts_;  // local
  std::unique_ptr<Mlp> shared_;
  std::vector<float> bias_;
  MoeLayerStats stats_;
  PlannedRows planned_;
};

}  // namespace cleave
