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

  // The weight W. Without `version`, each call says W changed (optimizer step, load): repack
  // lazily before the next product. With `version` (the owner's counter of writes to W, e.g. the
  // model's ParamStore), one call binds W for good and a product repacks whenever *version
  // differs from its copy's. `weight` must stay valid; it may be written only before a new
  // version (or call), or while rows are packed as below.
  void set_weight(const float* weight, const uint64_t* version = nullptr);

  // y = x W^T (+ bias if non-null). y is written (=).
  void forward(float* y, const float* x, int64_t N, const float* bias);
  // dx (=, or += when accumulate) dy W.
  // bf16 mode: the bf16 copy of dy made here is kept for the next backward_weight; dy must stay
  // unchanged until then.
  void backward_input(float* dx, const float* dy, int64_t N, bool accumulate);
  // dweight += dy^T x; dbias += column sums of dy (if non-null). x must be the array given to the
  // latest forward, unchanged: in bf16 mode its bf16 copy from forward is reused.
  // bf16 mode caches, keyed by (pointer, N): x is reused from the latest forward; dy is reused from
  // the latest backward_input, and that reuse consumes it (a later backward_weight, or one not
  // preceded by backward_input, converts dy itself). An x or dy that matches no cached copy is
  // converted here, so only changing an array in place between the paired calls is an error.
  // The bias gradient does not depend on the number of threads; the products are bitwise
  // reproducible for a fixed thread count.
  void backward_weight(float* dweight, float* dbias, const float* dy, const float* x, int64_t N);

  // For an optimizer that packs W while it writes it, after set_weight: the rows per band (0 when
  // no copy can be packed this way; they are then packed at the next product, as usual).
  // pack_rows packs rows [row0, row1) of W, whole bands, into every copy, serially: calls for
  // disjoint bands may run in parallel. Once every row has been, all_rows_packed() records the
  // copies as current.
  int64_t begin_row_packing();
  void pack_rows(int64_t row0, int64_t row1);
  void all_rows_packed();

  // Frees the prepacked weights (rebuilt at the next product): under ZeRO-3 a layer's weights
  // exist only while it runs.
  void release_packed();

  int in_features() const;
  int out_features() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
