// GELU (tanh approximation), SwiGLU and the residual add.
//
// Flat kernels are cut into fixed blocks of kBlock elements and the blocks are shared among
// threads, so whether an element lands in a vector body or a remainder loop depends only on n,
// never on the thread count. Transcendentals go through vmath::exp_f, which vectorises.
#include "cleave/kernels/activation.h"

#include <algorithm>

#include "cleave/base/check.h"
#include "cleave/kernels/for_blocks.h"
#include "cleave/kernels/vmath.h"

namespace cleave::kernels {
namespace {

constexpr int64_t kBlock = 4096;  // elements per task: 16 KiB, big enough to amortise scheduling

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Using 1 + tanh(u) =
// 2 sigmoid(2u) gives gelu(x) = x / (1 + exp(-2u)): one exp, and no cancellation for x << 0.
inline float gelu(float v) {
  const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
  return v / (1.0f + vmath::exp_f(-2.0f * u));
}

// d gelu / dx = s + 2 x s (1 - s) u' with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// 1 - s is computed as e * s (e = exp(-2u)) to keep its relative accuracy when s is near 1.
inline float gelu_slope(float v) {
  const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
  const float ex = vmath::exp_f(-2.0f * u);
  const float s = 1.0f / (1.0f + ex);
  return s + 2.0f * v * s * (ex * s) * du;
}

// The writers of an output: fp32, bf16 (a bf16 product's operand) or both, one type each so
// that every loop is compiled without a branch.
struct ToF32 {
  float* f;
  void operator()(int64_t i, float v) const { f[i] = v; }
};
struct ToBf16 {
  bf16* r;
  void operator()(int64_t i, float v) const { r[i] = to_bf16(v); }
};
struct ToBoth {
  float* f;
  bf16* r;
  void operator()(int64_t i, float v) const { f[i] = v, r[i] = to_bf16(v); }
};

template <class Body>
void with_grad_out(const GradOut& o, Body body) {
  CLEAVE_CHECK(o.f32 || o.rounded, "an activation's gradient needs somewhere to go");
  if (o.f32 && o.rounded) body(ToBoth{o.f32, o.rounded});
  else if (o.f32) body(ToF32{o.f32});
  else body(ToBf16{o.rounded});
}

template <class Out>
void gelu_forward_into(Out out, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) out(i, gelu(x[i]));
  });
}

template <class Out>
void gelu_backward_into(Out dx, const float* dout, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) dx(i, dout[i] * gelu_slope(x[i]));
  });
}

// out = silu(g) * up, silu(g) = g * sigmoid(g).
template <class Out>
void swiglu_forward_into(Out out, const float* gate_up, int64_t N, int F) {
  CLEAVE_CHECK(N >= 0, "N=" << N << " must be >= 0");
  CLEAVE_CHECK(F > 0, "F=" << F << " must be > 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* g = gate_up + i * 2 * static_cast<int64_t>(F);
    const float* u = g + F;
    for (int f = 0; f < F; f++) {
      const float sig = 1.0f / (1.0f + vmath::exp_f(-g[f]));
      out(i * F + f, g[f] * sig * u[f]);
    }
  }
}

// dgate = dout * up * sig * (1 + g (1 - sig)), dup = dout * silu(g).
template <class Out>
void swiglu_backward_into(Out dgate_up, const float* dout, const float* gate_up, int64_t N, int F) {
  CLEAVE_CHECK(N >= 0, "N=" << N << " must be >= 0");
  CLEAVE_CHECK(F > 0, "F=" << F << " must be > 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const int64_t row = i * 2 * static_cast<int64_t>(F);
    const float* g = gate_up + row;
    const float* u = g + F;
    const float* d = dout + i * F;
    for (int f = 0; f < F; f++) {
      const float ex = vmath::exp_f(-g[f]);
      const float sig = 1.0f / (1.0f + ex);
      const float gf = g[f], uf = u[f], df = d[f];
      dgate_up(row + f, df * uf * sig * (1.0f + gf * (ex * sig)));
      dgate_up(row + F + f, df * gf * sig);
    }
  }
}

}  // namespace

void gelu_forward(float* out, const float* x, int64_t n) { gelu_forward_into(ToF32{out}, x, n); }
void gelu_forward(bf16* out, const float* x, int64_t n) { gelu_forward_into(ToBf16{out}, x, n); }

void gelu_backward(GradOut dx, const float* dout, const float* x, int64_t n) {
  with_grad_out(dx, [&](auto out) { gelu_backward_into(out, dout, x, n); });
}

void swiglu_forward(float* out, const float* gate_up, int64_t N, int F) {
  swiglu_forward_into(ToF32{out}, gate_up, N, F);
}
void swiglu_forward(bf16* out, const float* gate_up, int64_t N, int F) {
  swiglu_forward_into(ToBf16{out}, gate_up, N, F);
}

void swiglu_backward(GradOut dgate_up, const float* dout, const float* gate_up, int64_t N, int F) {
  with_grad_out(dgate_up, [&](auto out) { swiglu_backward_into(out, dout, gate_up, N, F); });
}

void add_inplace(float* y, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) y[i] += x[i];
  });
}

}  // namespace cleave::kernels
