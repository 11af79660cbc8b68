// GELU (tanh approximation), SwiGLU and the residual add.
//
// Flat kernels are cut into fixed blocks of kBlock elements and the blocks are shared among
// threads, so whether an element lands in a vector body or a remainder loop depends only on n,
// never on the thread count. Transcendentals go through vmath::exp_f, which vectorises.
#include "cleave/kernels/activation.h"

#include <algorithm>

#include "cleave/base/bf16_round.h"
#include "cleave/base/check.h"
#include "cleave/kernels/column_sums.h"
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

// The writers of an output: fp32 or bf16 (a bf16 product's operand), one type each so that
// every loop is compiled without a branch. A loop computes a run of values into
// values(i, tile): the fp32 output itself where there is one, else a tile on the stack; commit
// then narrows the run for a bf16 output, 16 values at a time (bf16_round.h).
struct ToF32 {
  float* f;
  float* values(int64_t i, float*) const { return f + i; }
  void commit(int64_t, const float*, int64_t) const {}
};
struct ToBf16 {
  bf16* r;
  float* values(int64_t, float* tile) const { return tile; }
  void commit(int64_t i, const float* v, int64_t n) const { bf16_round_run(r + i, v, n); }
};

constexpr int64_t kRun = 256;  // values per run: a 1 KiB tile, a multiple of every vector width

// fn(v, i, n) writes v[j], the value of output element i + j, for j < n, on runs that cover
// [begin, end). paired_runs does the same for a kernel that makes two outputs per input (SwiGLU's
// backward): fn(v, v2, i, n) also writes v2[j], element second + (i - begin) + j.
template <class Out, class Fn>
void runs(Out out, int64_t begin, int64_t end, Fn fn) {
  alignas(64) float tile[kRun];
  for (int64_t i = begin; i < end; i += kRun) {
    const int64_t n = std::min(kRun, end - i);
    float* v = out.values(i, tile);
    fn(v, i, n);
    out.commit(i, v, n);
  }
}
template <class Out, class Fn>
void paired_runs(Out out, int64_t begin, int64_t end, int64_t second, Fn fn) {
  alignas(64) float tile[2][kRun];
  for (int64_t i = begin; i < end; i += kRun) {
    const int64_t n = std::min(kRun, end - i), i2 = second + (i - begin);
    float* v = out.values(i, tile[0]);
    float* v2 = out.values(i2, tile[1]);
    fn(v, v2, i, n);
    out.commit(i, v, n);
    out.commit(i2, v2, n);
  }
}

template <class Out>
void gelu_forward_into(Out out, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    runs(out, b, e, [=](float* __restrict v, int64_t i, int64_t m) {
      for (int64_t j = 0; j < m; j++) v[j] = gelu(x[i + j]);
    });
  });
}

template <class Out>
void gelu_backward_into(Out dx, const float* dout, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    runs(dx, b, e, [=](float* __restrict v, int64_t i, int64_t m) {
      for (int64_t j = 0; j < m; j++) v[j] = dout[i + j] * gelu_slope(x[i + j]);
    });
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
    const int64_t first = i * F;
    runs(out, first, first + F, [=](float* __restrict v, int64_t k, int64_t m) {
      const float* gk = g + (k - first);
      const float* uk = u + (k - first);
      for (int64_t j = 0; j < m; j++) {
        const float sig = 1.0f / (1.0f + vmath::exp_f(-gk[j]));
        v[j] = gk[j] * sig * uk[j];
      }
    });
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
    paired_runs(dgate_up, row, row + F, row + F,
                [=](float* __restrict dg, float* __restrict du, int64_t k, int64_t m) {
                  const int64_t f = k - row;
                  for (int64_t j = 0; j < m; j++) {
                    const float ex = vmath::exp_f(-g[f + j]);
                    const float sig = 1.0f / (1.0f + ex);
                    const float gf = g[f + j], uf = u[f + j], df = d[f + j];
                    dg[j] = df * uf * sig * (1.0f + gf * (ex * sig));
                    du[j] = df * gf * sig;
                  }
                });
  }
}

}  // namespace

void gelu_forward(float* out, const float* x, int64_t n) { gelu_forward_into(ToF32{out}, x, n); }
void gelu_forward(bf16* out, const float* x, int64_t n) { gelu_forward_into(ToBf16{out}, x, n); }

void gelu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  gelu_backward_into(ToF32{dx}, dout, x, n);
}
void gelu_backward(bf16* dx, const float* dout, const float* x, int64_t n) {
  gelu_backward_into(ToBf16{dx}, dout, x, n);
}

void gelu_backward_bias(bf16* dx, float* dbias, const float* dout, const float* x, int64_t N,
                        int F) {
  CLEAVE_CHECK(N >= 0 && F > 0, "gelu_backward_bias: N=" << N << ", F=" << F);
  add_column_sums(dbias, N, F, [=](int64_t n, int c0, int c1, float* __restrict tile) {
    const int64_t at = n * F + c0;
    for (int j = 0; j < c1 - c0; ++j) tile[j] = dout[at + j] * gelu_slope(x[at + j]);
    bf16_round_run(dx + at, tile, c1 - c0);
    return tile;
  });
}

void swiglu_forward(float* out, const float* gate_up, int64_t N, int F) {
  swiglu_forward_into(ToF32{out}, gate_up, N, F);
}
void swiglu_forward(bf16* out, const float* gate_up, int64_t N, int F) {
  swiglu_forward_into(ToBf16{out}, gate_up, N, F);
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F) {
  swiglu_backward_into(ToF32{dgate_up}, dout, gate_up, N, F);
}
void swiglu_backward(bf16* dgate_up, const float* dout, const float* gate_up, int64_t N, int F) {
  swiglu_backward_into(ToBf16{dgate_up}, dout, gate_up, N, F);
}

void add_inplace(float* y, const float* x, int64_t n) {
  for_blocks<kBlock>(n, [=](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) y[i] += x[i];
  });
}

}  // namespace cleave::kernels
