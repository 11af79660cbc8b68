// Matrix products of a linear layer through oneDNN, in PyTorch's layout: W is [out, in],
// y[N, out] = x[N, in] W^T + b. In bf16 mode the operands are converted to bf16 and oneDNN
// accumulates in fp32; outputs and weight gradients stay fp32. Weights are reordered once per
// update into the layout oneDNN prefers ("prepacked"), for forward and for backward_input.
// Primitives are cached per token count N. fp16 mode rounds every operand (x, dy, W) to fp16's
// values and multiplies them in fp32: an fp16 product with fp32 accumulation, bit for bit, on
// CPUs whose oneDNN (Debian 12's 2.6) has no fp16 matmul; it keeps no operand copies, and its
// speed is fp32's. fp8 mode quantises every operand to FP8 as its recipe says (kernels/fp8.h,
// docs/precision.md#fp8) and multiplies their images in bf16 with fp32 accumulation: the
// numerics of an FP8 GEMM, which this CPU does not have.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>

#include "cleave/base/bf16.h"
#include "cleave/base/buffer.h"
#include "cleave/kernels/fp8.h"

namespace cleave {

enum class Precision { fp32, bf16, fp16, fp8 };

// "fp32", "bf16", "fp16", "fp8". Inline: the config's rules name precisions without linking the
// kernels (tests/fuzz builds the config reader alone).
inline const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}
// Whether this CPU's oneDNN makes bf16 matmuls (AVX-512 BF16, AMX, or AVX-512 alone, which it
// emulates). Where it cannot (an AVX2-only CPU, such as AMD Zen 3), bf16 and FP8 products are fp32
// products of the same bf16 values: exact products, fp32 accumulation as oneDNN's, only the
// summation order may differ. CLEAVE_EMULATE_BF16=1 takes that path on any CPU (tests).
bool native_bf16_products();
// The products' dtype on a CPU with bf16 matmuls: fp16's are fp32 products of fp16-rounded
// operands, fp8's bf16 products of FP8 values (and its LM head's bf16). The same on every
// machine: what a model builds its linears with (a bf16 linear emulates where it must) and what
// the planner looks up in a cluster's tables.
Precision product_dtype(Precision p);
// Whether the per-row-count primitives give a row of a product of `p` the same bits at any row
// count, on this CPU (docs/inference.md): they do in fp32 and with AVX-512 BF16, not where bf16
// products run on AMX (oneDNN 2.6 runs 1-2 rows on AVX-512 BF16, and from K = 1,024 blocks K by
// the row count), nor in any dtype on a CPU without AVX-512 (Zen 3's AVX2 kernels).
// CLEAVE_ROW_TILES=1 says they do not on any CPU (tests).
bool row_invariant_products(Precision p);
// The rows of a tile where row-invariant products (LinearGemm::set_row_invariant) run in tiles.
inline constexpr int64_t kInvariantRowTile = 16;
// What the products run in here, and so whose GEMM peak MFU is quoted against: product_dtype,
// but bf16's are fp32 products where the CPU has no bf16 matmul.
Precision product_precision(Precision p);

// The operands of a linear's products as FP8 scales them: its input x, its weight W and its
// output's gradient dy.
enum Fp8Operand { fp8_x = 0, fp8_w = 1, fp8_dy = 2 };
using Fp8Triple = std::array<float, 3>;  // one value per Fp8Operand

// Where a per-tensor amax is completed before a "current" scale is taken from it: the ranks that
// hold other parts of the same tensor (tp shards, cp's sequence chunks). The model implements it.
class AmaxReducer {
 public:
  virtual ~AmaxReducer() = default;
  virtual float max(float local) = 0;  // the largest of every rank's local value
};

struct Fp8Settings {
  kernels::Fp8Recipe recipe = kernels::Fp8Recipe::delayed;
  int margin = 0;                        // per-tensor scales: fp8_max / amax / 2^margin
  AmaxReducer* activations = nullptr;    // current: x's and dy's amax (null: not sharded)
  AmaxReducer* weight = nullptr;         // current: W's amax
};

// An operand of a product converted to bf16 (bf16 mode), kept by whoever keeps the activation it
// copies, one per micro-batch in flight: forward's copy of x, or backward_input's copy of dy,
// serves the weight gradient of the same micro-batch without converting again. The owner says
// which copy belongs to which product; nothing is matched by address, so micro-batches in flight
// can never share one. fp32 and fp16 modes leave it empty. fp8 mode keeps the operand's FP8 codes
// as the weight gradient reads them (tiles along the tokens), with their dequantisation factors:
// the activations saved for backward in FP8 bytes.
struct OperandCopy {
  Buffer<bf16> data;
  Buffer<uint8_t> fp8;
  Buffer<float> factors;  // fp8: one per tile (one for a per-tensor scale)
  int64_t count = 0;  // elements converted by the latest product that filled it
  // The producer of this copy of an output gradient added its column sums to the bias gradient
  // as it wrote it (GELU's backward, kernels::gelu_backward_bias): the backward_weight that reads
  // the copy leaves the bias alone.
  bool bias_summed = false;
  // Room for the n bf16 values about to be written into it (by a product, or by the producer of
  // the operand), recorded as what the copy holds.
  bf16* refill(int64_t n) {
    count = n;
    bias_summed = false;
    return data.grow(n);
  }
};

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

  // y = x W^T (+ bias if non-null). y is written (=). bf16 mode: x's bf16 copy goes into
  // keep_x when given (for backward_weight), else into scratch.
  void forward(float* y, const float* x, int64_t N, const float* bias,
               OperandCopy* keep_x = nullptr);
  // y = x W^T (+ bias) from x's bf16 copy alone (bf16 mode): a producer that wrote its output
  // straight to bf16 (an activation) keeps no fp32 x. The copy must hold N rows.
  void forward_from_copy(float* y, const OperandCopy& x, int64_t N, const float* bias);
  // dx (=, or += when accumulate) dy W. bf16 mode: dy's copy goes into keep_dy when given.
  void backward_input(float* dx, const float* dy, int64_t N, bool accumulate,
                      OperandCopy* keep_dy = nullptr);
  // The same from dy's bf16 copy alone (bf16 mode), as forward_from_copy.
  void backward_input_from_copy(float* dx, const OperandCopy& dy, int64_t N, bool accumulate);
  // dweight += dy^T x; dbias += column sums of dy (if non-null, and unless dy_copy says that its
  // producer added them). bf16 mode: the copies given are
  // used in place of converting dy and x (they must hold them: checked by size); without one the
  // operand is converted here. x may be null where its copy is given. The bias gradient does not
  // depend on the number of threads; the products are bitwise reproducible for a fixed thread
  // count.
  void backward_weight(float* dweight, float* dbias, const float* dy, const float* x, int64_t N,
                       const OperandCopy* dy_copy = nullptr, const OperandCopy* x_copy = nullptr);
  // The copy of `count` floats at a that a product would keep (bf16 mode; nothing otherwise),
  // made without the product: a recompute that kept the product's output rebuilds its input.
  void copy_operand(const float* a, int64_t count, OperandCopy& keep);
  // The bytes such a copy of `rows` input rows holds (0 where products keep no copy).
  int64_t kept_copy_bytes(int64_t rows) const;
  // The bytes of the copies of W this linear holds between products on N rows: the weight
  // rounded (fp16 mode, emulated bf16), made by the first product of either kind, and each
  // product's packed layout that is not W itself (forward's and backward_input's, as this CPU's
  // oneDNN prefers them), made by the first product of its kind. All are freed together
  // (release_packed). For the planner: what a rank's weights cost beside the parameters.
  struct WeightCopies {
    int64_t rounded = 0, forward = 0, backward = 0;
    int64_t total() const { return rounded + forward + backward; }
    WeightCopies& operator+=(const WeightCopies& o) {
      rounded += o.rounded, forward += o.forward, backward += o.backward;
      return *this;
    }
  };
  WeightCopies weight_copy_bytes(int64_t N) const;
  // fp8 mode: the FP8 images of W that products on N rows make (kernels::fp8_traffic's
  // Fp8LinearUse): per weight version, for the copies packed from it, and at every product of a
  // role that reads W as it lies (where this CPU's oneDNN prefers that layout: no copy to keep
  // the image in).
  struct Fp8Images {
    int per_version = 0;
    bool per_forward = false, per_backward_input = false;
  };
  Fp8Images fp8_images(int64_t N) const;

  // The work buffers every linear's products on one thread share, each as large as its largest
  // use so far: conversions nobody keeps (fp16's roundings, bf16's conversions not kept, FP8's
  // images), emulated bf16's fp32 widenings, and FP8's weight image, codes, factors, the copies a
  // weight gradient quantises itself and the scaled results. For the planner: what the forward,
  // backward_input and backward_weight of this linear on N rows reserve in each (operands not
  // kept, accumulation into dx); `at_least` takes the larger of each buffer over linears.
  enum ThreadBuffer {
    operand0, operand1, widened0, widened1, scaled_result,
    fp8_weight_image, fp8_codes, fp8_factors, fp8_fresh_codes, fp8_fresh_factors,
    n_thread_buffers
  };
  struct ThreadScratch {
    std::array<int64_t, n_thread_buffers> bytes{};
    ThreadScratch& at_least(const ThreadScratch& o) {
      for (int i = 0; i < n_thread_buffers; ++i) bytes[i] = std::max(bytes[i], o.bytes[i]);
      return *this;
    }
    int64_t total() const {
      int64_t sum = 0;
      for (int64_t b : bytes) sum += b;
      return sum;
    }
  };
  ThreadScratch thread_scratch_bytes(int64_t N) const;
  // What the calling thread's buffers hold now (tests: the figure above is the products' own).
  static ThreadScratch thread_scratch_held();

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

  // Inference: while on, each row of a forward product gets the bits it gets at any row count.
  // Where the per-row-count primitives do not give that (row_invariant_products), each row gets
  // the bits of its tile of kInvariantRowTile rows (the last padded with zero rows): the tiles
  // run as one product where that primitive is seen to give each tile its own bits, else one by
  // one (docs/inference.md). Products
  // with variable rows pad their own (a mixture of experts' experts); fp8 products have no such
  // mode (inference runs in fp32 or bf16).
  void set_row_invariant(bool on);

  // For products whose row count changes every call (a mixture of experts' experts): one
  // primitive serves every N (oneDNN's runtime dimension) instead of one compiled per N, on the
  // weight in its own layout (bf16 mode: converted once per version, not reordered into a
  // blocked layout). Measured at 94-96% of the per-N primitives' speed, where compiling a
  // primitive for each new N cost most of a MoE step. Call before the first product.
  void set_variable_rows();

  // fp8 mode: the recipe, and where "current" scales' amaxes are reduced.
  void set_fp8(const Fp8Settings& settings);
  // fp8 "delayed": the largest magnitude each operand took since the last call (then zeroed),
  // and the per-tensor scales of the products from now on.
  Fp8Triple take_fp8_amax();
  void set_fp8_scales(const Fp8Triple& scales);
  // Per-tensor recipes: the scales of the latest products (delayed: the ones set; current: the
  // ones taken from the operands).
  Fp8Triple fp8_scales() const;
  // ZeRO-3's FP8 gathers (parallel/fp8_allgather.h): W now holds FP8 values dequantised with
  // `scale`, and shard_amax is the largest magnitude of the master values this rank holds. The
  // products take that scale (current) and record that amax (delayed), not the gathered values':
  // the same FP8 products and scales as a gather in fp32.
  void set_fp8_gathered_weight(float scale, float shard_amax);

  int in_features() const;
  int out_features() const;
  Precision precision() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
