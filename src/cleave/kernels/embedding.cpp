// Token and learned-position embeddings.
//
// Forward: rows are independent. Backward scatters into the embedding tables; several tokens may
// hit the same wte row, so instead of atomics each thread owns a block of kColBlock channels and
// walks all tokens in (b, t) order: every dwte element is summed in token order, whatever the
// thread count. dwpe rows are owned by position t and summed over b in order.
#include "cleave/kernels/embedding.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave::kernels {
namespace {

constexpr int kColBlock = 64;  // channels per task in the dwte scatter: 256 bytes per row touched

void check_shape(int64_t B, int64_t T, int C) {
  CLEAVE_CHECK(B >= 0 && T >= 0, "embedding B=" << B << " T=" << T << " must be >= 0");
  CLEAVE_CHECK(C > 0, "embedding C=" << C << " must be > 0");
}

void check_tokens(const int32_t* tokens, int64_t n) {
  // Validated before any parallel region: an exception must not escape OpenMP. The vocabulary
  // size is not part of the interface, so only negative ids can be caught here.
  for (int64_t i = 0; i < n; i++)
    CLEAVE_CHECK(tokens[i] >= 0, "embedding token " << i << " has negative id " << tokens[i]);
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int C, int64_t pos_offset) {
  check_shape(B, T, C);
  CLEAVE_CHECK(pos_offset >= 0, "embedding pos_offset=" << pos_offset << " must be >= 0");
  check_tokens(tokens, B * T);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < B * T; r++) {
    float* o = out + r * C;
    const float* e = wte + static_cast<int64_t>(tokens[r]) * C;
    if (wpe) {
      const float* p = wpe + (pos_offset + r % T) * C;
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    } else {
      for (int c = 0; c < C; c++) o[c] = e[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int C) {
  check_shape(B, T, C);
  check_tokens(tokens, B * T);
  const int64_t n = B * T;
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int blk = 0; blk < nblocks; blk++) {
      const int c0 = blk * kColBlock;
      const int c1 = std::min(C, c0 + kColBlock);
      for (int64_t r = 0; r < n; r++) {
        float* w = dwte + static_cast<int64_t>(tokens[r]) * C;
        const float* g = dout + r * C;
        for (int c = c0; c < c1; c++) w[c] += g[c];
      }
    }
    if (dwpe) {
      // Different arrays from dwte, so no barrier is needed between the two loops.
#pragma omp for schedule(static)
      for (int64_t t = 0; t < T; t++) {
        float* p = dwpe + t * C;
        for (int64_t b = 0; b < B; b++) {
          const float* g = dout + (b * T + t) * C;
          for (int c = 0; c < C; c++) p[c] += g[c];
        }
      }
    }
  }
}

}  // namespace cleave::kernels

namespace cleave::kernels {

void embedding_lookup_shard(float* out, const int32_t* tokens, const float* wte, int64_t N, int C,
                            int64_t vocab_begin, int64_t rows) {
  check_shape(N, 1, C);
  check_tokens(tokens, N);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; r++) {
    float* o = out + r * C;
    const int64_t row = int64_t(tokens[r]) - vocab_begin;
    if (row >= 0 && row < rows) std::copy(wte + row * C, wte + (row + 1) * C, o);
    else std::fill(o, o + C, 0.0f);
  }
}

void embedding_backward_shard(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int C, int64_t vocab_begin, int64_t rows) {
  check_shape(N, 1, C);
  check_tokens(tokens, N);
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t r = 0; r < N; r++) {
      const int64_t row = int64_t(tokens[r]) - vocab_begin;
      if (row < 0 || row >= rows) continue;
      float* w = dwte + row * C;
      const float* g = dout + r * C;
      for (int c = c0; c < c1; c++) w[c] += g[c];
    }
  }
}

void position_add(float* out, const float* wpe, int64_t n, int64_t row0, int64_t T, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float* p = wpe + ((row0 + i) % T) * C;
    float* o = out + i * C;
    for (int c = 0; c < C; c++) o[c] += p[c];
  }
}

void position_backward(float* dwpe, const float* dout, int64_t n, int64_t row0, int64_t T, int C) {
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t i = 0; i < n; i++) {
      float* p = dwpe + ((row0 + i) % T) * C;
      const float* g = dout + i * C;
      for (int c = c0; c < c1; c++) p[c] += g[c];
    }
  }
}

}  // namespace cleave::kernels
