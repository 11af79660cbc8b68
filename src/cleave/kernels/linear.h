// Matrix products of a linear layer through oneDNN, in PyTorch's layout: W is [out, in],
// y[N, out] = x[N, in] W^T + b. In bf16 mode the operands are converted to bf16 and oneDNN
// accumulates in fp32; outputs and weight gradients stay fp32. Weights are reordered once per
// update into the layout oneDNN prefers ("prepacked"), for forward and for backward_input.
// Primitives are cached per token count N.
#pragma once
#include <cstdint>
#include <memory>

namespace cleave {

enum class Precision { fp32, bf16 };

class LinearGemm {
 public:
  LinearGemm(int in_features, int out_features, Precision precision);
  ~LinearGemm();
  LinearGemm(LinearGemm&&) noexcept;
  LinearGemm& operator=(LinearGemm&&) noexcept;

  // The weights changed (optimizer step, load): repack lazily before the next product.
  // `weight` must stay valid and unchanged until the next call.
  void set_weight(const float* weight);

  // y = x W^T (+ bias if non-null). y is written (=).
  void forward(float* y, const float* x, int64_t N, const float* bias);
  // dx (=, or += when accumulate) dy W.
  void backward_input(float* dx, const float* dy, int64_t N, bool accumulate);
  // dweight += dy^T x; dbias += column sums of dy (if non-null). x must be the array given to the
  // latest forward, unchanged: in bf16 mode its bf16 copy from forward is reused.
  void backward_weight(float* dweight, float* dbias, const float* dy, const float* x, int64_t N);

  int in_features() const;
  int out_features() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
