// LinearGemm's fp8 side (kernels/linear.cpp): each operand quantised as the recipe says, the bf16
// image the product reads, and the factor its fp32 result is multiplied by.
//
// Per-tensor recipes (delayed, current) quantise a tensor with one scale s; the image holds the
// FP8 values themselves and the result is multiplied by 1 / (s_a s_b) afterwards, as an FP8 GEMM
// does. Tile recipes (blockwise, mxfp8) give each tile a power-of-two scale, so the image holds
// the dequantised values, exact in bf16, and the factor is 1. A product's tiles run along its
// inner dimension: x and dy in rows of tiles for forward and backward_input (1 x 128, 1 x 32), in
// columns for the weight gradient, whose inner dimension is the tokens (128 x 1, 32 x 1); W in
// 128 x 128 blocks for both of its products, or 1 x 32 along the inner dimension of each.
#pragma once
#include <cstdint>
#include <optional>

#include "cleave/kernels/fp8.h"
#include "cleave/kernels/linear.h"

namespace cleave::kernels {

class Fp8Operands {
 public:
  Fp8Operands(int in, int out) : in_(in), out_(out) {}

  Fp8Settings settings;
  // Per-tensor scales: delayed's, set between steps; current's, of the latest products.
  Fp8Triple scale = {1.0f, 1.0f, 1.0f};
  Fp8Triple amax = {0.0f, 0.0f, 0.0f};   // the largest magnitudes since take_fp8_amax
  // Set when W arrives from an FP8 gather (LinearGemm::set_fp8_gathered_weight).
  struct Gathered {
    float scale, shard_amax;
  };
  std::optional<Gathered> gathered;

  bool per_tensor() const {
    return settings.recipe == Fp8Recipe::delayed || settings.recipe == Fp8Recipe::current;
  }

  // W's image (fp32, row-major [out, in]) for forward's product or backward_input's, in a
  // per-thread buffer valid until the next call: it only feeds the packed bf16 copies. Its
  // factor is weight_factor() from then on.
  const float* weight_image(const float* w, bool forward);
  float weight_factor() const { return per_tensor() ? 1.0f / weight_scale_ : 1.0f; }
  // Whether forward's and backward_input's images differ (mxfp8 tiles run along each one's inner
  // dimension).
  bool weight_images_differ() const { return settings.recipe == Fp8Recipe::mxfp8; }

  // x (forward) or dy (backward_input), [rows, cols] with cols the product's inner dimension:
  // its image into `image`; `keep` (if given) receives its quantisation for the weight gradient.
  // Returns the product's factor for this operand.
  float inner_along_cols(bf16* image, const float* a, int64_t rows, int64_t cols,
                         Fp8Operand which, OperandCopy* keep);
  // The weight gradient's x or dy, whose inner dimension is the rows: the image of `copy`, or of
  // a quantises here when there is none. Returns the factor.
  float inner_along_rows(bf16* image, const float* a, int64_t rows, int64_t cols,
                         Fp8Operand which, const OperandCopy* copy);
  // What inner_along_cols keeps, alone (a recompute rebuilding x's copy).
  void keep(const float* a, int64_t rows, int64_t cols, Fp8Operand which, OperandCopy& keep);
  // The bytes keep fills for [rows, cols]: a code per element and a factor per tile.
  int64_t kept_bytes(int64_t rows, int64_t cols) const;
  // LinearGemm::thread_scratch_bytes' FP8 buffers for products on N rows, and what the calling
  // thread's hold (LinearGemm::thread_scratch_held).
  void thread_scratch(LinearGemm::ThreadScratch& s, int64_t N) const;
  static void thread_scratch_held(LinearGemm::ThreadScratch& s);

 private:
  static Fp8Format format(Fp8Operand which) {
    return which == fp8_dy ? Fp8Format::e5m2 : Fp8Format::e4m3;
  }
  int tile() const { return settings.recipe == Fp8Recipe::mxfp8 ? 32 : 128; }
  // W's tiles in forward's image or backward_input's (per-tensor recipes: unused).
  Fp8Tiles weight_tiles(bool forward) const;
  // The per-tensor scale for a (delayed: the set one; current: from a's amax, reduced), with a's
  // amax recorded.
  float tensor_scale(const float* a, int64_t n, Fp8Operand which, AmaxReducer* reducer);
  Fp8Tiles tiles_along_rows(int64_t rows, int64_t cols) const;
  void keep_along_rows(const float* a, int64_t rows, int64_t cols, Fp8Operand which,
                       OperandCopy& keep, float tensor_scale);

  int in_, out_;
  float weight_scale_ = 1.0f;  // the per-tensor scale of W's latest image
};

// How a model runs one FP8 linear, as far as the traffic below depends on it.
struct Fp8LinearUse {
  bool bias = false;          // its bias added by the product's epilogue
  bool x_kept = true;         // forward keeps x's codes for the weight gradient
  bool dy_kept = true;        // backward_input keeps dy's codes likewise (not when deferred)
  bool gathered_fp8 = false;  // W arrives from an FP8 gather with its amax (no amax pass)
  // The images of W its products make (LinearGemm::fp8_images): one per version by default.
  LinearGemm::Fp8Images images{1, false, false};
};

// The bytes the kernels above stream beside one linear's products (in -> out features) under
// `recipe`, for the planner (plan/step_work.cpp), counted from what each pass runs: an operand's
// amax, quantisation and bf16 image, the per-tensor epilogues, the weight gradient's scaled sum;
// a tile's second read of its band is taken to hit the cache.
struct Fp8Traffic {
  // Per product pass on N rows; backward_weight quantises again an operand not kept.
  double forward = 0, backward_input = 0, backward_weight = 0;
  // x's codes rebuilt for the weight gradient without a forward (selective recomputation).
  double x_copy = 0;
  // W's images once its version changes: every product's (the next product repacks every
  // copy), and one product's alone (ZeRO-3: each pass after a gather packs only its own copy).
  double weight_images = 0, weight_image_one = 0;
  Fp8Traffic& operator+=(const Fp8Traffic& o) {
    forward += o.forward, backward_input += o.backward_input, backward_weight += o.backward_weight;
    x_copy += o.x_copy, weight_images += o.weight_images, weight_image_one += o.weight_image_one;
    return *this;
  }
};
Fp8Traffic fp8_traffic(Fp8Recipe recipe, int64_t N, int64_t in, int64_t out,
                       const Fp8LinearUse& use);

// y[r, :] = y[r, :] * factor (+ bias): a per-tensor product's epilogue.
void fp8_epilogue(float* y, int64_t rows, int64_t cols, float factor, const float* bias);
// dst += src * factor.
void fp8_add_scaled(float* dst, const float* src, int64_t n, float factor);

}  // namespace cleave::kernels
