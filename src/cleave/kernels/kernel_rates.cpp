#include "cleave/kernels/kernel_rates.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <omp.h>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/base/pseudo_random.h"
#include "cleave/base/released_pages.h"
#include "cleave/kernels/activation.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/bench_timing.h"
#include "cleave/kernels/linear_fp8.h"
#include "cleave/kernels/norm.h"
#include "cleave/kernels/rope.h"

namespace cleave {

namespace {

constexpr int kRopeHeadDim = 64;

std::vector<float> zeros(int64_t n) { return std::vector<float>(size_t(n), 0.f); }

std::vector<float> values(int64_t n, uint32_t seed, float scale) {
  std::vector<float> v = zeros(n);
  fill_pseudo_random(v, seed, scale);
  return v;
}

}  // namespace

PassSeconds time_block_elementwise(const BlockKernels& b, double budget) {
  CLEAVE_CHECK(b.tokens > 0 && b.d_model > 0 && b.hidden > 0,
               "a block of " << b.tokens << " tokens, d_model " << b.d_model << ", hidden "
                             << b.hidden);
  const int64_t N = b.tokens, d = b.d_model, h = b.hidden;
  const int64_t act_in = b.swiglu ? 2 * h : h;  // SwiGLU reads the fused gate and up columns
  std::vector<float> x = values(N * d, 1, 2.f), mid = values(N * d, 2, 2.f),
                     out = values(N * d, 3, 2.f), normed = zeros(N * d),
                     dy = values(N * d, 4, 0.01f), dx = zeros(N * d), d_res = zeros(N * d),
                     fc = values(N * act_in, 5, 4.f), act = zeros(N * h),
                     d_act = values(N * h, 6, 0.01f), d_fc = zeros(N * act_in),
                     weight = values(d, 7, 1.f), bias = values(d, 8, 0.1f), dweight = zeros(d),
                     dbias = zeros(d), mean = zeros(N), rstd = zeros(N);
  for (float& w : weight) w += 1.f;
  // RoPE rotates the queries and keys of the qkv rows: d_model columns of each.
  const int rope_heads = int(std::max<int64_t>(1, d / kRopeHeadDim));
  std::vector<float> qk = values(N * 2 * rope_heads * kRopeHeadDim, 9, 1.f);
  std::vector<int32_t> positions(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) positions[size_t(t)] = int32_t(t % 4096);
  kernels::RopeTable rope(kRopeHeadDim, 4096, 10000.f);
  rope.ensure_computed();

  auto norm_forward = [&](float* y, const float* in) {
    if (b.swiglu) kernels::rmsnorm_forward(y, rstd.data(), in, weight.data(), N, int(d), 1e-5f);
    else kernels::layernorm_forward(y, mean.data(), rstd.data(), in, weight.data(), bias.data(),
                                    N, int(d), 1e-5f);
  };
  auto norm_backward = [&](const float* in) {
    if (b.swiglu) {
      kernels::rmsnorm_backward_input(dx.data(), dy.data(), in, weight.data(), rstd.data(), N, int(d));
      kernels::rmsnorm_backward_weight(dweight.data(), dy.data(), in, rstd.data(), N, int(d));
    } else {
      kernels::layernorm_backward_input(dx.data(), dy.data(), in, weight.data(), mean.data(),
                                        rstd.data(), N, int(d));
      kernels::layernorm_backward_weight(dweight.data(), dbias.data(), dy.data(), in, mean.data(),
                                         rstd.data(), N, int(d));
    }
  };
  const int64_t qk_stride = 2 * rope_heads * kRopeHeadDim;
  auto forward = [&] {
    norm_forward(normed.data(), x.data());
    if (b.swiglu) {
      kernels::rope_forward(qk.data(), rope, N, 2 * rope_heads, qk_stride, positions.data());
    }
    kernels::add_inplace(mid.data(), x.data(), N * d);
    norm_forward(normed.data(), mid.data());
    if (b.swiglu) kernels::swiglu_forward(act.data(), fc.data(), N, int(h));
    else kernels::gelu_forward(act.data(), fc.data(), N * h);
    kernels::add_inplace(out.data(), mid.data(), N * d);
  };
  auto backward = [&] {
    if (b.swiglu) kernels::swiglu_backward(d_fc.data(), d_act.data(), fc.data(), N, int(h));
    else kernels::gelu_backward(d_fc.data(), d_act.data(), fc.data(), N * h);
    norm_backward(mid.data());
    kernels::add_inplace(d_res.data(), dx.data(), N * d);
    if (b.swiglu) {
      kernels::rope_backward(qk.data(), rope, N, 2 * rope_heads, qk_stride, positions.data());
    }
    norm_backward(x.data());
    kernels::add_inplace(d_res.data(), dx.data(), N * d);
  };
  PassSeconds s;
  s.forward = time_calls(nullptr, forward, budget / 2).median;
  s.backward = time_calls(nullptr, backward, budget / 2).median;
  return s;
}

PassSeconds time_attention(int64_t tokens, int heads, int head_dim, double budget) {
  CLEAVE_CHECK(tokens > 0 && heads > 0 && head_dim > 0,
               "attention of " << tokens << " tokens, " << heads << " heads of " << head_dim);
  // As a block runs it: q, k and v side by side in the rows of one fused qkv buffer, and their
  // gradients likewise.
  kernels::AttentionShape shape;
  shape.B = 1;
  shape.T = tokens;
  shape.n_heads = shape.n_kv_heads = heads;
  shape.head_dim = head_dim;
  const int64_t width = int64_t(heads) * head_dim, stride = 3 * width;
  shape.q_row_stride = shape.kv_row_stride = stride;
  std::vector<float> qkv = values(tokens * stride, 1, 1.f), out = zeros(tokens * width),
                     lse = zeros(tokens * heads), dout = values(tokens * width, 2, 0.01f),
                     d_qkv = zeros(tokens * stride);
  const float *q = qkv.data(), *k = q + width, *v = k + width;
  float *dq = d_qkv.data(), *dk = dq + width, *dv = dk + width;
  PassSeconds s;
  s.forward = time_calls(nullptr, [&] {
    kernels::attention_forward(out.data(), lse.data(), q, k, v, shape);
  }, budget / 2).median;
  s.backward = time_calls(nullptr, [&] {
    kernels::attention_backward(dq, dk, dv, dout.data(), q, k, v, out.data(), lse.data(), shape);
  }, budget / 2).median;
  return s;
}

PackTiming time_weight_packing(int64_t N, int in, int out, Precision precision, double budget) {
  // A step packs every weight of the model once: its copies are written to memory the caches no
  // longer hold. The weights rotate through enough of them to pass any last-level cache here.
  constexpr double kColdBytes = double(256 << 20);
  const double w_bytes = double(out) * in * 4;
  const int n_weights = int(std::clamp(kColdBytes / (3 * w_bytes), 1.0, 64.0));
  std::vector<float> w = values(int64_t(out) * in, 1, 0.05f), x = values(N * in, 2, 2.f),
                     y = zeros(N * out), dy = values(N * out, 3, 0.01f), dx = zeros(N * in);
  uint64_t version = 1;
  std::vector<LinearGemm> gemms;
  for (int i = 0; i < n_weights; ++i) {
    gemms.emplace_back(in, out, precision);
    gemms.back().set_weight(w.data(), &version);
    // The products make their copies of W, which the packing then rewrites in place.
    gemms.back().forward(y.data(), x.data(), N, nullptr);
    gemms.back().backward_input(dx.data(), dy.data(), N, false);
  }
  PackTiming t;
  const LinearGemm::WeightCopies copies = gemms[0].weight_copy_bytes(N);
  t.copy_bytes = double(copies.forward + copies.backward);
  if (t.copy_bytes == 0) return t;  // the products read W itself: nothing to pack
  int next = 0;
  auto pack = [&] {
    LinearGemm& gemm = gemms[size_t(next++ % n_weights)];
    ++version;
    const int64_t band = gemm.begin_row_packing();
    CLEAVE_CHECK(band > 0, "a " << out << " x " << in << " weight with copies packs no bands");
    const int64_t bands = (out + band - 1) / band;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < bands; ++i) gemm.pack_rows(i * band, std::min<int64_t>(out, (i + 1) * band));
    gemm.all_rows_packed();
  };
  t.seconds = time_calls(nullptr, pack, budget).median;
  return t;
}

Fp8Timing time_fp8_kernels(int64_t N, int in, int out, kernels::Fp8Recipe recipe, double budget) {
  std::vector<float> w = values(int64_t(out) * in, 1, 0.05f), x = values(N * in, 2, 2.f),
                     y = zeros(N * out), dy = values(N * out, 3, 0.01f), dx = zeros(N * in),
                     dw = zeros(int64_t(out) * in);
  // A linear of each precision on the same W, each with its version of it and its kept operands.
  struct Linear {
    uint64_t version = 1;
    LinearGemm gemm;
    OperandCopy keep_x, keep_dy;
    Linear(int in, int out, Precision p, const float* w) : gemm(in, out, p) { gemm.set_weight(w, &version); }
  };
  Linear fp8(in, out, Precision::fp8, w.data()), bf16(in, out, Precision::bf16, w.data());
  Fp8Settings settings;
  settings.recipe = recipe;
  fp8.gemm.set_fp8(settings);
  auto pass = [&](Linear& l) {
    return [&, &l = l] {
      ++l.version;
      l.gemm.forward(y.data(), x.data(), N, nullptr, &l.keep_x);
      l.gemm.backward_input(dx.data(), dy.data(), N, false, &l.keep_dy);
      l.gemm.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N, &l.keep_dy, &l.keep_x);
    };
  };
  Fp8Timing t;
  kernels::Fp8LinearUse use;
  use.images = fp8.gemm.fp8_images(N);
  const kernels::Fp8Traffic bytes = kernels::fp8_traffic(recipe, N, in, out, use);
  t.bytes = bytes.forward + bytes.backward_input + bytes.backward_weight + bytes.weight_images;
  t.seconds = median_extra_seconds(pass(fp8), pass(bf16), 2 * budget);
  return t;
}

RefaultTiming time_refaults(int64_t buffer_bytes, int64_t range_bytes, double budget) {
  CLEAVE_CHECK(range_bytes > 0 && buffer_bytes > range_bytes,
               "ranges of " << range_bytes << " bytes in a buffer of " << buffer_bytes);
  Buffer<float> buffer(buffer_bytes / 4);
  float* base = buffer.data();
  std::memset(static_cast<void*>(base), 1, size_t(buffer.size()) * 4);
  constexpr int64_t kOffset = 1000;  // floats: the first unit's range starts off a page boundary
  const int64_t range = range_bytes / 4;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t b = kOffset; b + range <= buffer.size(); b += range) ranges.push_back({b, b + range});
  RefaultTiming t;
  t.bytes = double(ranges.size()) * double(range) * 4;
  auto write = [&] {
    for (const auto& [b, e] : ranges) std::fill(base + b, base + e, 0.5f);
  };
  auto release = [&] {
    for (const auto& [b, e] : ranges) release_range(base, b, e);
  };
  t.resident_seconds = time_calls(nullptr, write, budget / 2).median;
  t.released_seconds = time_calls(release, write, budget / 2).median;
  return t;
}

}  // namespace cleave
