// The MLP of a block as a module: y = proj(act(fc(x))), GELU for GPT-2, SwiGLU (fc holds the gate
// and up projections side by side) for Llama. Under tensor parallelism it holds the rank's hidden
// units: fc is column-parallel and proj row-parallel, so x is replicated (or gathered) on the tp
// ranks and y is a partial sum the block completes. A mixture of experts is another module with
// this interface (forward, backward_input, backward_weight, a Saved per micro-batch the caller
// owns) and nothing else in the block changed (docs/architecture.md, Modules).
#pragma once
#include <cstdint>

#include "cleave/base/buffer.h"
#include "cleave/model/layers.h"
#include "cleave/model/model_config.h"
#include "cleave/model/saved_bytes.h"
#include "cleave/model/spare_buffers.h"
#include "cleave/model/tp_share.h"

namespace cleave {

class Mlp {
 public:
  struct Saved {
    int64_t N = 0;
    Buffer<float> fc, act;        // fc's output, the activation's output (empty in bf16 mode)
    OperandCopy x_copy, act_copy;  // bf16 copies of the linears' inputs (x's when kept); in bf16
                                   // mode the activation is written straight into act_copy
    bool x_kept = false;
    Buffer<float> dy, d_fc;       // kept by a deferred input half
    WeightGradInputs weight;      // for the weight half: the output and fc gradients
    void release();
  };
  struct Scratch {  // shared by every block: the gradients inside one whole backward
    Buffer<float> d_act, d_fc;
    OperandCopy dy_copy, dfc_copy;
  };

  // hidden: the MLP's hidden units over every tp rank (0: model.ffn_hidden; a mixture of
  // experts' experts have their own); group: the parameter group its tensors join.
  Mlp(ParamStore& store, const std::string& name, const ModelConfig& c, const TpShare& share,
      Precision precision, int hidden = 0, int group = 0);
  void bind(ParamStore& store);
  void reserve(Scratch& g, int64_t N) const;

  // As SelfAttention's, over N tokens.
  void forward(Saved& s, float* y, const float* x, int64_t N, bool keep_x);
  void add_bias(float* y, int64_t rows) const { proj_.add_bias(y, rows); }
  void backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer);
  void backward_weight(Saved& s, const float* x);
  // Selective activation checkpointing: gives the activation's output and the linears' kept
  // input copies to `spares`, and rebuilds them, bitwise, from fc's output and the input x (no
  // product); take_spares gives s back spares for a forward or a rebuild of N rows.
  void release_activation(Saved& s, RecomputeSpares& spares) const;
  void take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const;
  void give_all(Saved& s, RecomputeSpares& spares) const;  // full recompute: every buffer
  void recompute_activation(Saved& s, const float* x);
  // As SelfAttention's, over N tokens.
  SavedBytes saved_bytes(int64_t N, bool keep_x) const;
  // Floats per row of Saved's fc and act; whether act is kept in fp32 (not in bf16 mode, where
  // proj reads the activation's bf16 copy alone).
  int64_t fc_width() const { return fc_.gemm().out_features(); }
  int64_t act_width() const { return ffn_; }
  bool act_in_fp32() const { return proj_.gemm().precision() != Precision::bf16; }
  // Whether a whole backward writes fc's output gradient in fp32 (not in bf16 mode, where the
  // activation's backward writes its bf16 copy and sums fc's bias; a deferred input half always
  // keeps it).
  bool fc_grad_in_fp32() const { return act_in_fp32(); }
  // Its products take a new row count at every call (an expert): LinearGemm::set_variable_rows.
  void set_variable_rows() {
    fc_.gemm().set_variable_rows();
    proj_.gemm().set_variable_rows();
  }

 private:
  const ModelConfig& cfg_;
  int hidden_;  // hidden units over every tp rank
  int ffn_;     // hidden units held
  void activate(Saved& s) const;  // act (or act_copy in bf16 mode) from fc
  Linear fc_, proj_;
};

}  // namespace cleave
