// Internal to attention.cpp: the block products. Every product is one small GEMM on a block pair,
// C[M, N] (+)= A[M, K] B[K, N], done by one register-tiled micro-kernel: B is read row by row as
// vectors (row-major, N contiguous) and A one element at a time and broadcast, so A may be stored
// transposed at no cost (strides ars, acs).
//
// An element is an fp32 value, or a pair of bf16 values (a 32-bit word, the lower half first)
// along K: then C gains A's pair times B's pair in each lane, the AVX-512 BF16 dot product
// (vdpbf16ps: the two exact products added to the accumulator, the odd one first as Intel defines
// it). Without that instruction the same two additions are made with fp32 FMAs.
//
// The micro-kernel uses GCC vector extensions (also understood by clang): with plain loops g++
// keeps the accumulator tile in memory (loads and stores around every FMA).
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cleave/base/bf16_round.h"  // <immintrin.h>, with GCC 12's AVX-512 warnings off

namespace cleave::kernels::attention_tiles {

#if defined(__AVX512F__)
constexpr int kVL = 16;  // floats per vector
constexpr int kMR = 6;   // micro-tile rows: 6 x 4 accumulators + 4 B vectors + 1 broadcast <= 32
constexpr int kNV = 4;   // micro-tile width in vectors
#else
constexpr int kVL = 8;  // AVX2 / SSE / NEON: 16 vector registers
constexpr int kMR = 6;  // 6 x 2 accumulators + 2 B vectors + 1 broadcast <= 16
constexpr int kNV = 2;
#endif
using vf = float __attribute__((vector_size(kVL * sizeof(float))));
using vu = uint32_t __attribute__((vector_size(kVL * sizeof(uint32_t))));
using pair16 = uint32_t;  // two bf16 values, the one of the lower K index in the lower half

template <class T>
inline auto loadv(const T* p) {
  std::conditional_t<std::is_same_v<T, float>, vf, vu> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// acc + a's pair . b's pairs, lane by lane.
inline vf dot_pairs(vf acc, pair16 a, vu b) {
#if defined(__AVX512BF16__)
  return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)_mm512_set1_epi32(int(a)), (__m512bh)b);
#else
  const vf b_even = (vf)(b << 16), b_odd = (vf)(b & 0xFFFF0000u);
  acc += std::bit_cast<float>(a & 0xFFFF0000u) * b_odd;
  return acc + std::bit_cast<float>(a << 16) * b_even;
#endif
}

// C[R, NV*kVL] (+)= sum_k A[r*ars + k*acs] B[k*ldb + c]. The accumulators stay in registers.
template <int R, int NV, bool Acc, class T>
inline void tile(float* __restrict C, int64_t ldc, const T* __restrict A, int64_t ars,
                 int64_t acs, const T* __restrict B, int64_t ldb, int64_t K) {
  vf acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = Acc ? loadv(C + r * ldc + c * kVL) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    const T* b = B + k * ldb;
    decltype(loadv(b)) bv[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) bv[c] = loadv(b + c * kVL);
    const T* a = A + k * acs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T ar = a[r * ars];
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) {
        if constexpr (std::is_same_v<T, float>)
          acc[r][c] += ar * bv[c];
        else
          acc[r][c] = dot_pairs(acc[r][c], ar, bv[c]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) storev(C + r * ldc + c * kVL, acc[r][c]);
}

// R rows, all N columns (N a multiple of kVL).
template <int R, bool Acc, class T>
inline void row_panel(float* C, int64_t ldc, const T* A, int64_t ars, int64_t acs, const T* B,
                      int64_t ldb, int64_t N, int64_t K) {
  int64_t c = 0;
  for (; c + kNV * kVL <= N; c += kNV * kVL)
    tile<R, kNV, Acc>(C + c, ldc, A, ars, acs, B + c, ldb, K);
  const int64_t rest = (N - c) / kVL;
  if constexpr (kNV > 1)
    if (rest == 1) tile<R, 1, Acc>(C + c, ldc, A, ars, acs, B + c, ldb, K);
  if constexpr (kNV > 2)
    if (rest == 2) tile<R, 2, Acc>(C + c, ldc, A, ars, acs, B + c, ldb, K);
  if constexpr (kNV > 3)
    if (rest == 3) tile<R, 3, Acc>(C + c, ldc, A, ars, acs, B + c, ldb, K);
}

template <bool Acc, int R = kMR - 1, class T>
inline void row_tail(int64_t rows, float* C, int64_t ldc, const T* A, int64_t ars, int64_t acs,
                     const T* B, int64_t ldb, int64_t N, int64_t K) {
  if constexpr (R > 0) {
    if (rows == R) return row_panel<R, Acc>(C, ldc, A, ars, acs, B, ldb, N, K);
    row_tail<Acc, R - 1>(rows, C, ldc, A, ars, acs, B, ldb, N, K);
  }
}

// Causal structure of a block product, so diagonal blocks skip (most of) their zero half. Row m of
// C only needs (or only has non-zero terms for) a range that moves with m, by whole row panels:
//   kColFrom: columns n >= m + off     kColTo: columns n <= m + off
//   kKFrom:   terms k >= m + off       kKTo:   terms k <= m + off
// Skipped columns of C are left unwritten (callers mask them); skipped terms are zero. The term
// forms count K in elements, fp32 products only.
enum class Tri { kNone, kColFrom, kColTo, kKFrom, kKTo };

// C[M, N] (+)= A[M, K] B[K, N]; A(m, k) = A[m*ars + k*acs]; N must be a multiple of kVL.
template <bool Acc, class T>
void gemm(float* C, int64_t ldc, const T* A, int64_t ars, int64_t acs, const T* B, int64_t ldb,
          int64_t M, int64_t N, int64_t K, Tri tri = Tri::kNone, int64_t off = 0) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, pair16>);
  for (int64_t r = 0; r < M; r += kMR) {
    const int64_t rows = std::min<int64_t>(kMR, M - r);
    int64_t c_lo = 0, c_hi = N, k_lo = 0, k_hi = K;
    switch (tri) {
      case Tri::kNone:
        break;
      case Tri::kColFrom:
        c_lo = std::clamp<int64_t>((r + off) / kVL * kVL, 0, N);
        break;
      case Tri::kColTo:
        c_hi = std::clamp<int64_t>(round_up(r + rows + off, kVL), 0, N);
        break;
      case Tri::kKFrom:
        k_lo = std::clamp<int64_t>(r + off, 0, K);
        break;
      case Tri::kKTo:
        k_hi = std::clamp<int64_t>(r + rows + off, 0, K);
        break;
    }
    if (c_hi <= c_lo) continue;
    float* c = C + r * ldc + c_lo;
    if (k_hi <= k_lo) {
      if (!Acc)
        for (int64_t i = 0; i < rows; ++i)
          std::memset(c + i * ldc, 0, sizeof(float) * (c_hi - c_lo));
      continue;
    }
    const T* a = A + r * ars + k_lo * acs;
    const T* b = B + k_lo * ldb + c_lo;
    if (rows == kMR)
      row_panel<kMR, Acc>(c, ldc, a, ars, acs, b, ldb, c_hi - c_lo, k_hi - k_lo);
    else
      row_tail<Acc>(rows, c, ldc, a, ars, acs, b, ldb, c_hi - c_lo, k_hi - k_lo);
  }
}

}  // namespace cleave::kernels::attention_tiles
