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

}  // namespace

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Using 1 + tanh(u) =
// 2 sigmoid(2u) gives gelu(x) = x / (1 + exp(-2u)): one exp, and no cancellation for x << 0.
void gelu_forward(float* out, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const float v = x[i];
      const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
      out[i] = v / (1.0f + vmath::exp_f(-2.0f * u));
    }
  });
}

// d gelu / dx = s + 2 x s (1 - s) u' with s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// 1 - s is computed as e * s (e = exp(-2u)) to keep its relative accuracy when s is near 1.
void gelu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const float v = x[i];
      const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
      const float ex = vmath::exp_f(-2.0f * u);
      const float s = 1.0f / (1.0f + ex);
      dx[i] = dout[i] * (s + 2.0f * v * s * (ex * s) * du);
    }
  });
}

// out = silu(g) * up, silu(g) = g * sigmoid(g).
void swiglu_forward(float* out, const float* gate_up, int64_t N, int F) {
  CLEAVE_CHECK(N >= 0, "N=" << N << " must be >= 0");
  CLEAVE_CHECK(F > 0, "F=" << F << " must be > 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* g = gate_up + i * 2 * static_cast<int64_t>(F);
    const float* u = g + F;
    float* o = out + i * F;
    for (int f = 0; f < F; f++) {
      const float sig = 1.0f / (1.0f + vmath::exp_f(-g[f]));
      o[f] = g[f] * sig * u[f];
    }
  }
}

// dgate = dout * up * sig * (1 + g (1 - sig)), dup = dout * silu(g).
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F) {
  CLEAVE_CHECK(N >= 0, "N=" << N << " must be >= 0");
  CLEAVE_CHECK(F > 0, "F=" << F << " must be > 0");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; i++) {
    const float* g = gate_up + i * 2 * static_cast<int64_t>(F);
    const float* u = g + F;
    const float* d = dout + i * F;
    float* dg = dgate_up + i * 2 * static_cast<int64_t>(F);
    float* du = dg + F;
    for (int f = 0; f < F; f++) {
      const float ex = vmath::exp_f(-g[f]);
      const float sig = 1.0f / (1.0f + ex);
      const float gf = g[f], uf = u[f], df = d[f];
      dg[f] = df * uf * sig * (1.0f + gf * (ex * sig));
      du[f] = df * gf * sig;
    }
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) y[i] += x[i];
  });
}

}  // namespace cleave::kernels
