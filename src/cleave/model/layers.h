// The parameterised building blocks of a block: a linear layer and a normalisation layer. Each has
// forward, backward_input (dx) and backward_weight (dW) as separate calls (docs/architecture.md,
// Model).
#pragma once
#include <cstdint>
#include <string>

#include "cleave/kernels/linear.h"
#include "cleave/model/params.h"

namespace cleave {

// in and out are local: a column-parallel weight (placement on dimension 0) holds some output
// rows, and its bias the same rows; a row-parallel one (dimension 1) some input columns, and its
// bias is whole, added once after the partial products are summed (add_bias), not by forward.
class Linear {
 public:
  Linear(ParamStore& store, const std::string& name, int in, int out, bool bias, float init_std,
         Precision precision, Placement placement = {}, int group = 0);
  // After store.allocate(): take the buffer addresses; the store tells the product of writes.
  void bind(ParamStore& store);

  // The bf16 copies (bf16 mode) a caller keeps for the weight gradient: LinearGemm's.
  void forward(float* y, const float* x, int64_t N, OperandCopy* keep_x = nullptr);
  // From x's bf16 copy alone (bf16 mode): LinearGemm::forward_from_copy.
  void forward_from_copy(float* y, const OperandCopy& x, int64_t N);
  void add_bias(float* y, int64_t N) const;  // row-parallel: y[i, :] += bias
  void backward_input(float* dx, const float* dy, int64_t N, bool accumulate,
                      OperandCopy* keep_dy = nullptr);
  void backward_input_from_copy(float* dx, const OperandCopy& dy, int64_t N, bool accumulate);
  void backward_weight(const float* dy, const float* x, int64_t N,
                       const OperandCopy* dy_copy = nullptr, const OperandCopy* x_copy = nullptr);

  int weight_index() const { return w_; }
  bool has_bias() const { return b_ >= 0; }
  // The bias's gradient, for a producer of the output gradient that sums it as it writes it.
  float* bias_grad() { return dbias_; }
  LinearGemm& gemm() { return gemm_; }
  const LinearGemm& gemm() const { return gemm_; }

 private:
  int w_, b_ = -1;
  bool bias_after_sum_ = false;
  LinearGemm gemm_;
  float *weight_ = nullptr, *bias_ = nullptr, *dweight_ = nullptr, *dbias_ = nullptr;
};

// What a module's backward_input leaves its backward_weight: its output's gradient and the gradient
// inside it (the input of its first linear's product), with their bf16 copies where one whole
// backward keeps them (null: converted when the weight gradients need them).
struct WeightGradInputs {
  const float* dy = nullptr;
  const float* inner = nullptr;
  const OperandCopy* dy_copy = nullptr;
  const OperandCopy* inner_copy = nullptr;
};

// The per-row statistics a norm's forward saves for its backward. The caller keeps them, one per
// micro-batch in flight.
struct NormStats {
  Buffer<float> mean, rstd;
};

// LayerNorm (weight and bias) for GPT-2, RMSNorm (weight only) for Llama.
class Norm {
 public:
  // pending: kTpAxis under sequence parallelism, where each tp rank norms its own rows.
  Norm(ParamStore& store, const std::string& name, int dim, bool layernorm, float eps,
       const std::string& pending = "");
  void bind(ParamStore& store);

  void forward(float* y, const float* x, int64_t N, NormStats& stats);
  void backward_input(float* dx, const float* dy, const float* x, int64_t N,
                      const NormStats& stats);  // dx +=
  void backward_weight(const float* dy, const float* x, int64_t N, const NormStats& stats);

 private:
  int dim_;
  bool layernorm_;
  float eps_;
  int w_, b_ = -1;
  float *weight_ = nullptr, *bias_ = nullptr, *dweight_ = nullptr, *dbias_ = nullptr;
};

}  // namespace cleave
