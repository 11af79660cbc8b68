#include "cleave/kernels/linear_fp8.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave::kernels {

namespace {

// Codes and factors nobody keeps, per thread, grown as needed.
template <typename T>
Buffer<T>& scratch_buffer() {
  static thread_local Buffer<T> buffer;
  return buffer;
}
template <typename T>
T* scratch(int64_t n) {
  return scratch_buffer<T>().grow(n);
}

// One buffer per thread for every linear's weight image, grown only: an image per linear would
// hold 4 bytes per weight, and one allocated per use would fault its pages in every step.
Buffer<float>& weight_images() {
  static thread_local Buffer<float> images;
  return images;
}

// A weight gradient's operand quantised here (no copy kept by forward or backward_input).
OperandCopy& fresh_copy() {
  static thread_local OperandCopy fresh;
  return fresh;
}

template <typename T>
int64_t held_bytes(const Buffer<T>& b) {
  return aligned_bytes(b.size(), sizeof(T));
}

// A per-tensor operand's image: its codes' raw FP8 values (the product's epilogue applies the
// scales, as the hardware does).
template <typename T>
void raw_image(T* image, const uint8_t* codes, int64_t rows, int64_t cols, Fp8Format f) {
  const float one = 1.0f;
  fp8_image(image, codes, &one, Fp8Tiles::whole(rows, cols), f);
}

}  // namespace

float Fp8Operands::tensor_scale(const float* a, int64_t n, Fp8Operand which,
                                AmaxReducer* reducer) {
  const float local = abs_max(a, n);
  amax[size_t(which)] = std::max(amax[size_t(which)], local);
  if (settings.recipe == Fp8Recipe::delayed) return scale[size_t(which)];
  scale[size_t(which)] =
      fp8_scale(reducer ? reducer->max(local) : local, format(which), settings.margin, 1.0f);
  return scale[size_t(which)];
}

Fp8Tiles Fp8Operands::tiles_along_rows(int64_t rows, int64_t cols) const {
  return {rows, cols, tile(), 1};
}

const float* Fp8Operands::weight_image(const float* w, bool forward) {
  const int64_t n = int64_t(out_) * in_;
  float* image = weight_images().grow(n);
  uint8_t* codes = scratch<uint8_t>(n);
  if (per_tensor()) {
    if (gathered) {
      // The gather's scale and its shard's amax: quantising its dequantised values again with
      // that scale gives its codes back.
      amax[fp8_w] = std::max(amax[fp8_w], gathered->shard_amax);
      if (settings.recipe == Fp8Recipe::current) scale[fp8_w] = gathered->scale;
      weight_scale_ = scale[fp8_w];
    } else {
      weight_scale_ = tensor_scale(w, n, fp8_w, settings.weight);
    }
    fp8_quantize(codes, w, n, weight_scale_, Fp8Format::e4m3);
    raw_image(image, codes, out_, in_, Fp8Format::e4m3);
  } else {
    const Fp8Tiles t = weight_tiles(forward);
    float* factors = scratch<float>(t.count());
    fp8_quantize_tiles(codes, factors, w, t, format(fp8_w));
    fp8_image(image, codes, factors, t, Fp8Format::e4m3);
  }
  return image;
}

float Fp8Operands::inner_along_cols(bf16* image, const float* a, int64_t rows, int64_t cols,
                                    Fp8Operand which, OperandCopy* keep) {
  const int64_t n = rows * cols;
  if (per_tensor()) {
    const float s = tensor_scale(a, n, which, settings.activations);
    uint8_t* codes = keep ? keep->fp8.grow(n) : scratch<uint8_t>(n);
    fp8_quantize(codes, a, n, s, format(which));
    if (keep) {
      keep->factors.grow(1)[0] = 1.0f / s;
      keep->count = n;
    }
    raw_image(image, codes, rows, cols, format(which));
    return 1.0f / s;
  }
  const Fp8Tiles t{rows, cols, 1, tile()};
  uint8_t* codes = scratch<uint8_t>(n);
  float* factors = scratch<float>(t.count());
  fp8_quantize_tiles(codes, factors, a, t, format(which));
  fp8_image(image, codes, factors, t, format(which));
  if (keep) keep_along_rows(a, rows, cols, which, *keep, 0.0f);
  return 1.0f;
}

void Fp8Operands::keep_along_rows(const float* a, int64_t rows, int64_t cols, Fp8Operand which,
                                  OperandCopy& keep, float tensor_scale) {
  const int64_t n = rows * cols;
  uint8_t* codes = keep.fp8.grow(n);
  if (per_tensor()) {
    fp8_quantize(codes, a, n, tensor_scale, format(which));
    keep.factors.grow(1)[0] = 1.0f / tensor_scale;
  } else {
    const Fp8Tiles t = tiles_along_rows(rows, cols);
    fp8_quantize_tiles(codes, keep.factors.grow(t.count()), a, t, format(which));
  }
  keep.count = n;
}

void Fp8Operands::keep(const float* a, int64_t rows, int64_t cols, Fp8Operand which,
                       OperandCopy& keep) {
  const float s = per_tensor() ? tensor_scale(a, rows * cols, which, settings.activations) : 0.0f;
  keep_along_rows(a, rows, cols, which, keep, s);
}

int64_t Fp8Operands::kept_bytes(int64_t rows, int64_t cols) const {
  const int64_t factors = per_tensor() ? 1 : tiles_along_rows(rows, cols).count();
  return rows * cols + factors * int64_t(sizeof(float));
}

float Fp8Operands::inner_along_rows(bf16* image, const float* a, int64_t rows, int64_t cols,
                                    Fp8Operand which, const OperandCopy* copy) {
  if (!copy) {
    // Quantised here as forward or backward_input would have kept it: the same codes.
    keep(a, rows, cols, which, fresh_copy());
    copy = &fresh_copy();
  }
  CLEAVE_CHECK(copy->count == rows * cols, "LinearGemm::backward_weight: the kept FP8 copy holds "
                                               << copy->count << " elements, not " << rows * cols);
  if (per_tensor()) {
    raw_image(image, copy->fp8.data(), rows, cols, format(which));
    return copy->factors[0];
  }
  fp8_image(image, copy->fp8.data(), copy->factors.data(), tiles_along_rows(rows, cols),
            format(which));
  return 1.0f;
}

Fp8Tiles Fp8Operands::weight_tiles(bool forward) const {
  if (settings.recipe == Fp8Recipe::mxfp8)
    return forward ? Fp8Tiles{out_, in_, 1, 32} : Fp8Tiles{out_, in_, 32, 1};
  return {out_, in_, 128, 128};
}

void Fp8Operands::thread_scratch(LinearGemm::ThreadScratch& s, int64_t N) const {
  const int64_t w = int64_t(in_) * out_;
  s.bytes[LinearGemm::fp8_weight_image] = aligned_bytes(w, sizeof(float));
  s.bytes[LinearGemm::fp8_codes] = aligned_bytes(std::max({w, N * in_, N * out_}), 1);
  s.bytes[LinearGemm::fp8_fresh_codes] = aligned_bytes(N * std::max(in_, out_), 1);
  if (per_tensor()) {
    s.bytes[LinearGemm::fp8_fresh_factors] = aligned_bytes(1, sizeof(float));
    return;
  }
  // Tiles along each product's inner dimension: W's, x's and dy's as forward and backward_input
  // quantise them, and a weight gradient's operands along their rows.
  const int64_t factors = std::max({weight_tiles(true).count(), weight_tiles(false).count(),
                                    Fp8Tiles{N, in_, 1, tile()}.count(),
                                    Fp8Tiles{N, out_, 1, tile()}.count()});
  s.bytes[LinearGemm::fp8_factors] = aligned_bytes(factors, sizeof(float));
  s.bytes[LinearGemm::fp8_fresh_factors] = aligned_bytes(
      std::max(tiles_along_rows(N, in_).count(), tiles_along_rows(N, out_).count()), sizeof(float));
}

void Fp8Operands::thread_scratch_held(LinearGemm::ThreadScratch& s) {
  s.bytes[LinearGemm::fp8_weight_image] = held_bytes(weight_images());
  s.bytes[LinearGemm::fp8_codes] = held_bytes(scratch_buffer<uint8_t>());
  s.bytes[LinearGemm::fp8_factors] = held_bytes(scratch_buffer<float>());
  s.bytes[LinearGemm::fp8_fresh_codes] = held_bytes(fresh_copy().fp8);
  s.bytes[LinearGemm::fp8_fresh_factors] = held_bytes(fresh_copy().factors);
}

Fp8Traffic fp8_traffic(Fp8Recipe recipe, int64_t N, int64_t in, int64_t out,
                       const Fp8LinearUse& use) {
  const double x = double(N) * double(in), y = double(N) * double(out);
  const double w = double(in) * double(out);
  const bool per_tensor = recipe == Fp8Recipe::delayed || recipe == Fp8Recipe::current;
  // Codes: a float read and a code written; an image: the code read and its bf16 written.
  constexpr double codes = 4 + 1, image = 1 + 2, amax = 4;
  // An operand's codes for its product (per-tensor: after an amax pass) and its image; tile
  // recipes keep a second set of codes, tiled along the rows, for the weight gradient.
  const double operand = per_tensor ? amax + codes + image : codes + image;
  const double kept = per_tensor ? 0 : codes;
  // An operand not kept is quantised again by the weight gradient (keep()).
  const double again = per_tensor ? amax + codes : codes;
  Fp8Traffic t;
  t.forward = (operand + (use.x_kept ? kept : 0)) * x;
  t.backward_input = (operand + (use.dy_kept ? kept : 0)) * y;
  // The weight gradient reads both operands' images, made from the codes kept or made again.
  t.backward_weight = image * (x + y) + (use.x_kept ? 0 : again * x) + (use.dy_kept ? 0 : again * y);
  t.x_copy = again * x;
  if (per_tensor) {
    // Scaled results: forward's and backward_input's epilogues (read and written); the weight
    // gradient made in a temporary, then the temporary read and dW read and written.
    t.forward += 8 * y;
    t.backward_input += 8 * x;
    t.backward_weight += 12 * w;
  } else if (use.bias) {
    t.forward += 8 * y;
  }
  // W's codes (per-tensor: after its amax, unless the gather brought it) and a float image that
  // the packer reads (mxfp8's tiles run along each product's inner dimension: an image each), or
  // that a product reading W as it lies reads, made anew for each such product.
  const double one = ((per_tensor && !use.gathered_fp8 ? amax : 0) + codes + 1 + 4) * w;
  t.weight_image_one = one;
  t.weight_images = use.images.per_version * one;
  if (use.images.per_forward) t.forward += one;
  if (use.images.per_backward_input) t.backward_input += one;
  return t;
}

void fp8_epilogue(float* y, int64_t rows, int64_t cols, float factor, const float* bias) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] = row[c] * factor + bias[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] *= factor;
    }
  }
}

void fp8_add_scaled(float* dst, const float* src, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i] * factor;
}

}  // namespace cleave::kernels
