// The pieces both passes of attention (kernels/attention.h) are built from: one register-tiled
// micro-kernel for every block product, C[M,N] (+)= A[M,K] B[K,N], with B read row by row as
// vectors (row-major, N contiguous) and A read one scalar at a time and broadcast, so that A may be
// stored transposed at no cost (strides ars, acs); the packing into such layouts; the documents of
// a block pair; per-thread scratch; and the shape's checks. Internal to the attention kernels.
//
// The micro-kernel uses GCC vector extensions (also understood by clang): with plain loops g++
// keeps the accumulator tile in memory (loads and stores around every FMA). The elementwise loops
// (softmax, packing) are plain and auto-vectorise; exp is vmath::exp_f (no -ffast-math).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/transpose16.h"

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

// Block sizes (query rows x key columns), multiples of kVL; any combination is valid. 64 x 64 keeps
// a block of S, K^T or V at 16 KB (head_dim 64). Measured on Zen 4: 128-wide blocks in either pass
// were within noise (+-5%) at T = 256 and T = 2048.
constexpr int64_t kFwdQ = 64, kFwdK = kAttentionKeyBlock;
constexpr int64_t kBwdQ = 64, kBwdK = 64;

inline vf loadv(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
// kVL bf16 values widened to fp32 (exact: each is the upper half of its fp32), one zero-extending
// load and a shift (the vector extensions' convert splits into halves).
inline vf loadv(const bf16* p) {
#if defined(__AVX512F__)
  const __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
#elif defined(__AVX2__)
  const __m256i wide = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
#else
  uint32_t wide[kVL];
  for (int i = 0; i < kVL; ++i) wide[i] = uint32_t(p[i]) << 16;
#endif
  vf v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// a b + c rounded once, written out rather than left to the compiler's contraction: the forward
// kernel (attention_forward.cpp, compiled with -ffp-contract=off) makes a number the same way
// whether a query shares its vector lanes with others or runs alone, and g++ contracted the two
// paths' mul-adds differently on AVX2 (Zen 3), where the decoding path then lost its bits.
inline vf splat(float a) {  // a broadcast (vf{} + a would be an add, kept under no contraction)
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(a);
#elif defined(__AVX__)
  return (vf)_mm256_set1_ps(a);
#else
  vf r;
  for (int i = 0; i < kVL; ++i) r[i] = a;
  return r;
#endif
}
inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  vf r;
  for (int i = 0; i < kVL; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
#endif
}

// C[R, NV*kVL] (+)= sum_k A[r*ars + k*acs] * B[k*ldb + c]. The accumulators stay in registers.
template <int R, int NV, bool Acc>
inline void tile(float* __restrict C, int64_t ldc, const float* __restrict A, int64_t ars,
                 int64_t acs, const float* __restrict B, int64_t ldb, int64_t K) {
  vf acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = Acc ? loadv(C + r * ldc + c * kVL) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    vf bv[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) bv[c] = loadv(b + c * kVL);
    const float* a = A + k * acs;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float ar = a[r * ars];
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] = fmadd(splat(ar), bv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) storev(C + r * ldc + c * kVL, acc[r][c]);
}

// R rows, all N columns (N a multiple of kVL).
template <int R, bool Acc>
inline void row_panel(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs,
                      const float* B, int64_t ldb, int64_t N, int64_t K) {
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

template <bool Acc, int R = kMR - 1>
inline void row_tail(int64_t rows, float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs,
                     const float* B, int64_t ldb, int64_t N, int64_t K) {
  if constexpr (R > 0) {
    if (rows == R) return row_panel<R, Acc>(C, ldc, A, ars, acs, B, ldb, N, K);
    row_tail<Acc, R - 1>(rows, C, ldc, A, ars, acs, B, ldb, N, K);
  }
}

// Causal structure of a block product, so diagonal blocks skip (most of) their zero half. Row m of
// C only needs (or only has non-zero terms for) a range that moves with m, by whole row panels:
//   kColFrom: columns n >= m + off     kColTo: columns n <= m + off
//   kKFrom:   terms k >= m + off       kKTo:   terms k <= m + off
// Skipped columns of C are left unwritten (callers mask them); skipped terms are zero.
enum class Tri { kNone, kColFrom, kColTo, kKFrom, kKTo };

// C[M, N] (+)= A[M, K] B[K, N]; A(m, k) = A[m*ars + k*acs]; N must be a multiple of kVL.
template <bool Acc>
void gemm(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs, const float* B,
          int64_t ldb, int64_t M, int64_t N, int64_t K, Tri tri = Tri::kNone, int64_t off = 0) {
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
    const float* a = A + r * ars + k_lo * acs;
    const float* b = B + k_lo * ldb + c_lo;
    if (rows == kMR)
      row_panel<kMR, Acc>(c, ldc, a, ars, acs, b, ldb, c_hi - c_lo, k_hi - k_lo);
    else
      row_tail<Acc>(rows, c, ldc, a, ars, acs, b, ldb, c_hi - c_lo, k_hi - k_lo);
  }
}

// dst[d * ld + i] = src[i * ss + d] * scale for i < n, d < hd; zero for n <= i < n_pad. With
// AVX-512, 16 rows at a time are turned into columns 16 values at a time in registers; otherwise
// (and for what is left) rows are read contiguously and the scattered stores stay in L1 (this
// order is ~2x faster than the reverse).
inline void pack_transposed(float* __restrict dst, int64_t ld, const float* __restrict src, int64_t ss,
                     int64_t n, int64_t n_pad, int64_t hd, float scale) {
  int64_t i0 = 0;
#ifdef __AVX512F__
  const int64_t hd16 = hd / 16 * 16;
  const __m512 sc = _mm512_set1_ps(scale);
  for (; i0 + 16 <= n; i0 += 16) {
    for (int64_t d0 = 0; d0 < hd16; d0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_mul_ps(_mm512_loadu_ps(src + (i0 + i) * ss + d0), sc);
      transpose16(r);
      for (int d = 0; d < 16; ++d) _mm512_storeu_ps(dst + (d0 + d) * ld + i0, r[d]);
    }
    for (int64_t i = i0; i < i0 + 16; ++i)
      for (int64_t d = hd16; d < hd; ++d) dst[d * ld + i] = src[i * ss + d] * scale;
  }
#endif
  for (int64_t i = i0; i < n; ++i) {
    const float* row = src + i * ss;
    for (int64_t d = 0; d < hd; ++d) dst[d * ld + i] = row[d] * scale;
  }
  for (int64_t d = 0; d < hd; ++d)
    for (int64_t i = n; i < n_pad; ++i) dst[d * ld + i] = 0.0f;
}

// sum_d a[d] b[d] in a fixed order: kVL lane partial sums (a sequential sum is latency-bound).
inline float dot(const float* a, const float* b, int64_t n) {
  vf acc{};
  int64_t d = 0;
  for (; d + kVL <= n; d += kVL) acc += loadv(a + d) * loadv(b + d);
  float sum = 0.0f;
  for (int l = 0; l < kVL; ++l) sum += acc[l];
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// How the documents of a block of queries and a block of keys meet. Ids are non-decreasing along a
// sequence, so each block's first and last id bound all of them.
enum class Docs { kOne, kMixed, kApart };  // one document for all; some pairs differ; all differ

inline Docs docs_of(const int32_t* qid, int64_t nq, const int32_t* kid, int64_t nk) {
  if (!qid) return Docs::kOne;
  if (kid[nk - 1] < qid[0] || kid[0] > qid[nq - 1]) return Docs::kApart;
  const bool one = kid[0] == kid[nk - 1] && qid[0] == qid[nq - 1] && kid[0] == qid[0];
  return one ? Docs::kOne : Docs::kMixed;
}

// Per-thread scratch, 64-byte aligned, kept from call to call and grown when a call needs more:
// freed after every call, it went back to the kernel and came back through page faults and TLB
// shootdowns, several percent of a call. A call's slots are its own while it runs (forward and
// backward share some: neither runs inside the other).
inline float* thread_scratch(int slot, int64_t n) {
  static thread_local Buffer<float> slots[16];
  return slots[slot].grow(n);
}

inline void check_shape(const AttentionShape& s) {
  CLEAVE_CHECK(s.B > 0 && s.T > 0, "attention: B=" << s.B << ", T=" << s.T << " must be positive");
  CLEAVE_CHECK(
      s.n_heads > 0 && s.n_kv_heads > 0,
      "attention: n_heads=" << s.n_heads << ", n_kv_heads=" << s.n_kv_heads << " must be positive");
  CLEAVE_CHECK(
      s.n_heads % s.n_kv_heads == 0,
      "attention: n_heads=" << s.n_heads << " is not a multiple of n_kv_heads=" << s.n_kv_heads);
  CLEAVE_CHECK(s.head_dim > 0, "attention: head_dim=" << s.head_dim << " must be positive");
  const int64_t q_row = int64_t{s.n_heads} * s.head_dim;
  const int64_t kv_row = int64_t{s.n_kv_heads} * s.head_dim;
  CLEAVE_CHECK(s.q_row_stride >= q_row,
               "attention: q_row_stride=" << s.q_row_stride
                                          << " is smaller than n_heads*head_dim=" << q_row);
  CLEAVE_CHECK(s.kv_row_stride >= kv_row,
               "attention: kv_row_stride=" << s.kv_row_stride
                                           << " is smaller than n_kv_heads*head_dim=" << kv_row);
  CLEAVE_CHECK(s.Tk >= 0, "attention: Tk=" << s.Tk << " is negative");
  CLEAVE_CHECK(s.q_begin >= 0 && s.k_begin >= 0,
               "attention: q_begin=" << s.q_begin << ", k_begin=" << s.k_begin
                                     << " must not be negative");
  CLEAVE_CHECK(!s.q_seq == !s.k_seq, "attention: q_seq and k_seq are given together or not at all");
  // Block skipping trusts the order of the ids (docs_of): a wrong order would drop keys silently.
  auto ordered = [&](const int32_t* ids, int64_t n) {
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t t = 1; t < n; ++t)
        if (ids[b * n + t] < ids[b * n + t - 1]) return false;
    return true;
  };
  if (s.q_seq) {
    CLEAVE_CHECK(ordered(s.q_seq, s.T), "attention: q_seq decreases within a sequence");
    CLEAVE_CHECK(ordered(s.k_seq, s.keys()), "attention: k_seq decreases within a sequence");
  }
}

}  // namespace cleave::kernels::attention_tiles
