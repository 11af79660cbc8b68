#include "cleave/kernels/linear_fp8.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave::kernels {

namespace {

// Codes and factors nobody keeps, per thread, grown as needed.
template <typename T>
T* scratch(int64_t n) {
  static thread_local Buffer<T> buffer;
  return buffer.grow(n);
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
  // One buffer per thread for every linear's image, grown only: an image per linear would hold
  // 4 bytes per weight, and one allocated per use would fault its pages in every step.
  static thread_local Buffer<float> images;
  float* image = images.grow(n);
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
    Fp8Tiles t{out_, in_, 128, 128};
    if (settings.recipe == Fp8Recipe::mxfp8)
      t = forward ? Fp8Tiles{out_, in_, 1, 32} : Fp8Tiles{out_, in_, 32, 1};
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
    static thread_local OperandCopy fresh;
    keep(a, rows, cols, which, fresh);
    copy = &fresh;
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

Fp8Traffic fp8_traffic(Fp8Recipe recipe, int64_t N, int64_t in, int64_t out, bool bias) {
  const double x = double(N) * double(in), y = double(N) * double(out);
  const double w = double(in) * double(out);
  Fp8Traffic t;
  // Codes and images: a float read and a code written, the code read and its bf16 written.
  constexpr double quantise = 4 + 1, image = 1 + 2;
  // The images the weight gradient's product reads, from the codes forward and backward kept.
  t.backward_weight = image * (x + y);
  if (recipe == Fp8Recipe::delayed || recipe == Fp8Recipe::current) {
    // An amax pass before the quantisation; a scaled epilogue on the result (read and written).
    const double operand = 4 + quantise + image, epilogue = 8;
    t.forward = operand * x + epilogue * y;
    t.backward_input = operand * y + epilogue * x;
    // The weight gradient made in a temporary, then scaled into dW: the temporary read, dW read
    // and written.
    t.backward_weight += 12 * w;
    // amax, quantisation, and a float image that the packer reads.
    t.weight_image = (4 + quantise + 1 + 4) * w;
    return t;
  }
  // Tiles: the operand's tiles along its inner dimension for the product, and again along the
  // rows for the weight gradient's copy; the result needs no scaling (bias alone).
  const double operand = quantise + image + quantise;
  t.forward = operand * x + (bias ? 8 * y : 0);
  t.backward_input = operand * y;
  // mxfp8's tiles run along each product's inner dimension: an image for each of W's products.
  t.weight_image = (quantise + 1 + 4) * w * (recipe == Fp8Recipe::mxfp8 ? 2 : 1);
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
