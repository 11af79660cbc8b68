// Causal GQA attention, FlashAttention-2 style, fp32 on CPU.
//
// Every product is one small GEMM on a block pair, C[M,N] (+)= A[M,K] B[K,N], done by one register-
// tiled micro-kernel: B is read row by row as vectors (row-major, N contiguous) and A is read one
// scalar at a time and broadcast, so A may be stored transposed at no cost (strides ars, acs). The
// loops are arranged so that B is always either contiguous in memory or a small block we pack once
// and reuse many times:
//
// forward, one (b, head, query block) per task:   S^T[keys, queries] = K_j (Q_i scale)^T
//   A = K rows straight from memory, B = Q_i^T packed once per task. Softmax statistics are per
//   query = per column of S^T, so running max and row sums are vertical vector ops, never
//   horizontal reductions. O += P V_j with A = (S^T)^T read through strides, B = V_j rows.
//   Key blocks past the diagonal are skipped; diagonal blocks skip their masked half by row panel.
//
// backward, one (b, kv head) per task: for each key block j (K_j^T, V_j^T packed once), for each
//   query head of the group and each query block i on or below the diagonal:
//     S = Q_i (K_j scale)^T, P = exp(S - lse), dV_j += P^T dO_i, dP = dO_i V_j^T,
//     dS = P (dP - D), dK_j += scale dS^T Q_i, dQ_i += dS (K_j scale).
//   The task owns dk/dv of its kv head and dq of the heads of its group, so there are no atomics
//   and no write conflicts; every sum runs in a fixed order (heads, then query blocks, then key
//   blocks ascending for dq), so results do not depend on the number of threads.
//
// In both passes ranges of tokens (context parallelism) shift the diagonal: query row i is key
// row i + shift. Block pairs whose documents differ throughout are skipped like blocks past the
// diagonal; a pair that holds a document boundary masks element-wise, and only such pairs pay.
//
// The micro-kernel uses GCC vector extensions (also understood by clang): with plain loops g++
// keeps the accumulator tile in memory (loads and stores around every FMA). The elementwise loops
// (softmax, packing) are plain and auto-vectorise; exp is vmath::exp_f (no -ffast-math).
#include "cleave/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/kernels/transpose16.h"
#include "cleave/kernels/vmath.h"

namespace cleave::kernels {
namespace {

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
constexpr int64_t kFwdQ = 64, kFwdK = 64;
constexpr int64_t kBwdQ = 64, kBwdK = 64;

inline vf loadv(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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
      for (int c = 0; c < NV; ++c) acc[r][c] += ar * bv[c];
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
void pack_transposed(float* __restrict dst, int64_t ld, const float* __restrict src, int64_t ss,
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
float dot(const float* a, const float* b, int64_t n) {
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

Docs docs_of(const int32_t* qid, int64_t nq, const int32_t* kid, int64_t nk) {
  if (!qid) return Docs::kOne;
  if (kid[nk - 1] < qid[0] || kid[0] > qid[nq - 1]) return Docs::kApart;
  const bool one = kid[0] == kid[nk - 1] && qid[0] == qid[nq - 1] && kid[0] == qid[0];
  return one ? Docs::kOne : Docs::kMixed;
}

// Per-thread scratch, 64-byte aligned, kept from call to call and grown when a call needs more:
// freed after every call, it went back to the kernel and came back through page faults and TLB
// shootdowns, several percent of a call. Forward and backward take different slots.
float* thread_scratch(int slot, int64_t n) {
  static thread_local Buffer<float> slots[16];
  return slots[slot].grow(n);
}

void check_shape(const AttentionShape& s) {
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

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s) {
  check_shape(s);
  CLEAVE_CHECK(out && lse && q && k && v, "attention_forward: null pointer");
  const int64_t Tq = s.T, Tk = s.keys(), H = s.n_heads, hd = s.head_dim, qs = s.q_row_stride,
                kvs = s.kv_row_stride, group = s.n_heads / s.n_kv_heads;
  const int64_t shift = s.q_begin - s.k_begin;  // query row i is the token of key row i + shift
  const int64_t hdp = round_up(hd, kVL);        // padded row length of the V / O blocks
  const int64_t nqb = (Tq + kFwdQ - 1) / kFwdQ, nkb = (Tk + kFwdK - 1) / kFwdK;
  const int64_t tasks = s.B * H * nqb;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr float kLowest = std::numeric_limits<float>::lowest();

#pragma omp parallel
  {
    float* qt = thread_scratch(0, hd * kFwdQ);      // [hd][kFwdQ]: scaled Q_i^T
    float* st = thread_scratch(1, kFwdK * kFwdQ);   // [kFwdK][kFwdQ]: S^T, then P^T
    float* vb = thread_scratch(2, kFwdK * hdp);     // [kFwdK][hdp]: V_j, padded (hd < hdp)
    float* ob = thread_scratch(3, kFwdQ * hdp);     // [kFwdQ][hdp]: unnormalised output rows
    float* m = thread_scratch(4, 3 * kFwdQ);        // running max per query
    float* l = m + kFwdQ;                           // running sum of exp(s - m) per query
    float* alpha = m + 2 * kFwdQ;                   // exp(m_old - m_new)

    // Causal cost grows with the query block index: dynamic scheduling, largest blocks first.
    // Each task's result depends only on its inputs, so the schedule does not change the output.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t ib = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / H, h = bh % H, kvh = h / group;
      const int64_t q0 = ib * kFwdQ, nq = std::min(kFwdQ, Tq - q0), nqp = round_up(nq, kVL);
      const int64_t qa = q0 + shift;  // the block's first query token, as a key row
      const int32_t* qid = s.q_seq ? s.q_seq + b * Tq + q0 : nullptr;
      const int32_t* kids = s.k_seq ? s.k_seq + b * Tk : nullptr;

      pack_transposed(qt, kFwdQ, q + (b * Tq + q0) * qs + h * hd, qs, nq, nqp, hd, scale);
      // The running max starts finite: a query that has seen no key yet (a whole column of -inf)
      // then gets alpha = exp(0) and P = exp(-inf) = 0, not exp(-inf + inf) = NaN.
      for (int64_t i = 0; i < kFwdQ; ++i) m[i] = kLowest, l[i] = 0.0f;
      std::memset(ob, 0, sizeof(float) * kFwdQ * hdp);

      // Key blocks past the one holding the last query's token are fully masked: skipped.
      const int64_t jend = qa + nq <= 0 ? 0 : std::min(nkb, (qa + nq - 1) / kFwdK + 1);
      bool first = true;
      for (int64_t j = 0; j < jend; ++j) {
        const int64_t k0 = j * kFwdK, nk = std::min(kFwdK, Tk - k0);
        const Docs docs = docs_of(qid, nq, kids ? kids + k0 : nullptr, nk);
        if (docs == Docs::kApart) continue;
        const float* kbase = k + (b * Tk + k0) * kvs + kvh * hd;
        const bool diag = k0 + kFwdK - 1 > qa;  // block crosses the diagonal
        // S^T row kk (key k0+kk) is needed only for queries qa+i >= k0+kk.
        gemm<false>(st, kFwdQ, kbase, kvs, 1, qt, kFwdQ, nk, nqp, hd,
                    diag ? Tri::kColFrom : Tri::kNone, k0 - qa);
        if (diag) {  // key k0+kk is hidden from queries i < thr
          for (int64_t kk = 0; kk < nk; ++kk) {
            const int64_t thr = std::min(k0 + kk - qa, nqp);
            float* row = st + kk * kFwdQ;
            for (int64_t i = 0; i < thr; ++i) row[i] = kNegInf;
          }
        }
        if (docs == Docs::kMixed) {
          for (int64_t kk = 0; kk < nk; ++kk) {
            const int32_t id = kids[k0 + kk];
            float* row = st + kk * kFwdQ;
            for (int64_t i = 0; i < nq; ++i) row[i] = qid[i] == id ? row[i] : kNegInf;
          }
        }
        // Online softmax, column-wise: all loops below are elementwise over queries i.
        for (int64_t i = 0; i < nqp; ++i) alpha[i] = m[i];
        for (int64_t kk = 0; kk < nk; ++kk) {
          const float* row = st + kk * kFwdQ;
          for (int64_t i = 0; i < nqp; ++i) alpha[i] = row[i] > alpha[i] ? row[i] : alpha[i];
        }
        // Now alpha = m_new.
        for (int64_t i = 0; i < nqp; ++i) {
          const float m_new = alpha[i];
          alpha[i] = vmath::exp_f(m[i] - m_new);  // 0 on the first key a query sees
          m[i] = m_new;
          l[i] *= alpha[i];
        }
        for (int64_t kk = 0; kk < nk; ++kk) {
          float* row = st + kk * kFwdQ;
          for (int64_t i = 0; i < nqp; ++i) {
            row[i] = vmath::exp_f(row[i] - m[i]);
            l[i] += row[i];
          }
        }
        if (!first) {
          for (int64_t i = 0; i < nq; ++i) {
            float* orow = ob + i * hdp;
            const float a = alpha[i];
            for (int64_t d = 0; d < hdp; ++d) orow[d] *= a;
          }
        }
        first = false;
        // V_j's rows as they lie, or copied with their padding where hd is not a whole number of
        // vectors.
        const float* vrows = v + (b * Tk + k0) * kvs + kvh * hd;
        int64_t ldv = kvs;
        if (hdp != hd) {
          for (int64_t kk = 0; kk < nk; ++kk) {
            float* row = vb + kk * hdp;
            std::memcpy(row, vrows + kk * kvs, sizeof(float) * hd);
            for (int64_t d = hd; d < hdp; ++d) row[d] = 0.0f;
          }
          vrows = vb, ldv = hdp;
        }
        // O += (P^T)^T V_j; query qa+i has non-zero P for keys k0+kk <= qa+i only.
        gemm<true>(ob, hdp, st, 1, kFwdQ, vrows, ldv, nq, hdp, nk, diag ? Tri::kKTo : Tri::kNone,
                   qa - k0);
      }

      float* obase = out + ((b * Tq + q0) * H + h) * hd;
      float* lbase = lse + (b * H + h) * Tq + q0;
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = obase + i * H * hd;
        if (l[i] == 0.0f) {  // saw no key (one that it saw would add exp(0) = 1 to l)
          std::memset(dst, 0, sizeof(float) * hd);
          lbase[i] = kNegInf;
          continue;
        }
        const float inv = 1.0f / l[i];
        const float* orow = ob + i * hdp;
        for (int64_t d = 0; d < hd; ++d) dst[d] = orow[d] * inv;
        lbase[i] = m[i] + std::log(l[i]);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& s, bool accumulate) {
  check_shape(s);
  CLEAVE_CHECK(dq && dk && dv && dout && q && k && v && out && lse,
               "attention_backward: null pointer");
  const int64_t Tq = s.T, Tk = s.keys(), H = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim,
                qs = s.q_row_stride, kvs = s.kv_row_stride, group = s.n_heads / s.n_kv_heads;
  const int64_t shift = s.q_begin - s.k_begin;  // query row i is the token of key row i + shift
  const int64_t hdp = round_up(hd, kVL);
  const int64_t nqb = (Tq + kBwdQ - 1) / kBwdQ, nkb = (Tk + kBwdK - 1) / kBwdK;
  const int64_t tasks = s.B * Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#pragma omp parallel
  {
    float* kt = thread_scratch(5, hd * kBwdK);      // [hd][kBwdK]: scale K_j^T
    float* ksc = thread_scratch(6, kBwdK * hdp);    // [kBwdK][hdp]: scale K_j
    float* vt = thread_scratch(7, hd * kBwdK);      // [hd][kBwdK]: V_j^T
    float* dka = thread_scratch(8, kBwdK * hdp);    // [kBwdK][hdp]: dK_j / scale accumulator
    float* dva = thread_scratch(9, kBwdK * hdp);    // [kBwdK][hdp]: dV_j accumulator
    float* qb = thread_scratch(10, kBwdQ * hdp);    // [kBwdQ][hdp]: Q_i, padded (hd < hdp)
    float* dob = thread_scratch(11, kBwdQ * hdp);   // [kBwdQ][hdp]: dO_i, padded (hd < hdp)
    float* pb = thread_scratch(12, kBwdQ * kBwdK);  // [kBwdQ][kBwdK]: P
    float* dsb = thread_scratch(13, kBwdQ * kBwdK); // [kBwdQ][kBwdK]: dP, then dS
    float* dqt = thread_scratch(14, kBwdQ * hdp);   // [kBwdQ][hdp]: this key block's part of dQ_i
    float* Dv = thread_scratch(15, group * Tq);     // [group][Tq]: D = rowsum(dO * O) per head

    // All tasks cost the same: static schedule.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      const int32_t* qids = s.q_seq ? s.q_seq + b * Tq : nullptr;
      const int32_t* kids = s.k_seq ? s.k_seq + b * Tk : nullptr;

      for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t h = g * group + hh;
        for (int64_t t = 0; t < Tq; ++t) {
          const float* o = out + ((b * Tq + t) * H + h) * hd;
          const float* dO = dout + ((b * Tq + t) * H + h) * hd;
          Dv[hh * Tq + t] = dot(o, dO, hd);
          if (!accumulate) std::memset(dq + (b * Tq + t) * qs + h * hd, 0, sizeof(float) * hd);
        }
      }

      for (int64_t j = 0; j < nkb; ++j) {
        const int64_t k0 = j * kBwdK, nk = std::min(kBwdK, Tk - k0);
        const int32_t* kid = kids ? kids + k0 : nullptr;
        // The query blocks that see a key of j: from the one holding token k_begin + k0 (earlier
        // ones are causally masked), less those whose documents are all apart. With ordered ids
        // these are a first and a last run of blocks.
        auto apart = [&](int64_t ib) {
          const int64_t q0 = ib * kBwdQ;
          return docs_of(qids ? qids + q0 : nullptr, std::min(kBwdQ, Tq - q0), kid, nk) ==
                 Docs::kApart;
        };
        int64_t ib_lo = std::max<int64_t>(k0 - shift, 0) / kBwdQ, ib_hi = nqb;
        while (ib_lo < ib_hi && apart(ib_lo)) ++ib_lo;
        while (ib_lo < ib_hi && apart(ib_hi - 1)) --ib_hi;
        float* dkbase = dk + (b * Tk + k0) * kvs + g * hd;
        float* dvbase = dv + (b * Tk + k0) * kvs + g * hd;
        if (ib_lo >= ib_hi) {  // no query sees these keys
          if (!accumulate)
            for (int64_t kk = 0; kk < nk; ++kk) {
              std::memset(dkbase + kk * kvs, 0, sizeof(float) * hd);
              std::memset(dvbase + kk * kvs, 0, sizeof(float) * hd);
            }
          continue;
        }
        const float* kbase = k + (b * Tk + k0) * kvs + g * hd;
        const float* vbase = v + (b * Tk + k0) * kvs + g * hd;
        // Pack K_j^T, V_j^T (zero columns past nk: the products over hd then give 0 there) and
        // K_j rows (zero rows past nk / columns past hd).
        pack_transposed(kt, kBwdK, kbase, kvs, nk, kBwdK, hd, scale);
        pack_transposed(vt, kBwdK, vbase, kvs, nk, kBwdK, hd, 1.0f);
        for (int64_t kk = 0; kk < kBwdK; ++kk) {
          float* row = ksc + kk * hdp;
          int64_t d = 0;
          if (kk < nk)
            for (; d < hd; ++d) row[d] = kbase[kk * kvs + d] * scale;
          for (; d < hdp; ++d) row[d] = 0.0f;
        }
        std::memset(dka, 0, sizeof(float) * kBwdK * hdp);
        std::memset(dva, 0, sizeof(float) * kBwdK * hdp);

        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t h = g * group + hh;
          for (int64_t ib = ib_lo; ib < ib_hi; ++ib) {
            const int64_t q0 = ib * kBwdQ, nq = std::min(kBwdQ, Tq - q0);
            const int32_t* qid = qids ? qids + q0 : nullptr;
            const bool mixed = docs_of(qid, nq, kid, nk) == Docs::kMixed;
            // Q_i's and dO_i's rows as they lie, or copied with their padding (as V_j in forward).
            const float* qrows = q + (b * Tq + q0) * qs + h * hd;
            const float* drows = dout + ((b * Tq + q0) * H + h) * hd;
            int64_t ldq = qs, ldd = H * hd;
            if (hdp != hd) {
              for (int64_t i = 0; i < nq; ++i) {
                std::memcpy(qb + i * hdp, qrows + i * ldq, sizeof(float) * hd);
                std::memcpy(dob + i * hdp, drows + i * ldd, sizeof(float) * hd);
                for (int64_t d = hd; d < hdp; ++d) qb[i * hdp + d] = dob[i * hdp + d] = 0.0f;
              }
              qrows = qb, drows = dob, ldq = ldd = hdp;
            }

            // On a diagonal block query q0+i (token of key row qa+i) sees keys c <= qa+i-k0 = i+dq0
            // only: S, dP and dQ skip the rest of each row, dV and dK the queries before each key.
            const int64_t qa = q0 + shift;
            const bool diag = k0 + kBwdK - 1 > qa;
            const int64_t dq0 = qa - k0;
            const Tri row_cols = diag ? Tri::kColTo : Tri::kNone;
            gemm<false>(pb, kBwdK, qrows, ldq, 1, kt, kBwdK, nq, kBwdK, hd, row_cols, dq0);  // S
            gemm<false>(dsb, kBwdK, drows, ldd, 1, vt, kBwdK, nq, kBwdK, hd, row_cols, dq0);  // dP
            const float* lrow = lse + (b * H + h) * Tq + q0;
            const float* Drow = Dv + hh * Tq + q0;
            for (int64_t i = 0; i < nq; ++i) {
              float* p = pb + i * kBwdK;
              float* ds = dsb + i * kBwdK;
              // Past `lim` (causal mask, padding past Tk) S and dP may be unwritten: P = dS = 0.
              int64_t lim = diag ? std::clamp<int64_t>(i + dq0 + 1, 0, kBwdK) : kBwdK;
              const float li = lrow[i], Di = Drow[i];
              if (li == kNegInf) lim = 0;  // sees no key at all; exp(s - li) would be inf
              if (mixed) {                 // keys of other documents: P = exp(-inf) = 0
                const int64_t n = std::min(lim, nk);
                for (int64_t c = 0; c < n; ++c) p[c] = kid[c] == qid[i] ? p[c] : kNegInf;
              }
              for (int64_t c = 0; c < lim; ++c) {
                p[c] = vmath::exp_f(p[c] - li);
                ds[c] = p[c] * (ds[c] - Di);
              }
              for (int64_t c = lim; c < kBwdK; ++c) p[c] = ds[c] = 0.0f;
            }
            const Tri key_rows = diag ? Tri::kKFrom : Tri::kNone;
            gemm<true>(dva, hdp, pb, 1, kBwdK, drows, ldd, nk, hdp, nq, key_rows, -dq0);  // P^T dO_i
            gemm<true>(dka, hdp, dsb, 1, kBwdK, qrows, ldq, nk, hdp, nq, key_rows, -dq0);  // dS^T Q_i
            gemm<false>(dqt, hdp, dsb, kBwdK, 1, ksc, hdp, nq, hdp, nk,                 // dS K_j s
                        diag ? Tri::kKTo : Tri::kNone, dq0);
            for (int64_t i = 0; i < nq; ++i) {
              float* dst = dq + (b * Tq + q0 + i) * qs + h * hd;
              const float* src = dqt + i * hdp;
              for (int64_t d = 0; d < hd; ++d) dst[d] += src[d];
            }
          }
        }

        for (int64_t kk = 0; kk < nk; ++kk) {
          float* dkrow = dkbase + kk * kvs;
          float* dvrow = dvbase + kk * kvs;
          const float* dks = dka + kk * hdp;
          const float* dvs = dva + kk * hdp;
          if (accumulate)
            for (int64_t d = 0; d < hd; ++d) dkrow[d] += dks[d] * scale, dvrow[d] += dvs[d];
          else
            for (int64_t d = 0; d < hd; ++d) dkrow[d] = dks[d] * scale, dvrow[d] = dvs[d];
        }
      }
    }
  }
}

void attention_merge(float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                     const AttentionShape& s) {
  CLEAVE_CHECK(s.B > 0 && s.T > 0 && s.n_heads > 0 && s.head_dim > 0,
               "attention_merge: B=" << s.B << ", T=" << s.T << ", n_heads=" << s.n_heads
                                     << ", head_dim=" << s.head_dim << " must be positive");
  CLEAVE_CHECK(out_a && lse_a && out_b && lse_b, "attention_merge: null pointer");
  const int64_t T = s.T, H = s.n_heads, hd = s.head_dim;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < T; ++t) {
      float* oa = out_a + ((b * T + t) * H + h) * hd;
      const float* ob = out_b + ((b * T + t) * H + h) * hd;
      float& la = lse_a[bh * T + t];
      const float lb = lse_b[bh * T + t];
      // Nothing to add; and were la -inf too, lo - hi below would be NaN. With la = -inf alone the
      // weights are exactly 0 and 1: out_a becomes out_b.
      if (lb == kNegInf) continue;
      // log(exp(la) + exp(lb)) without overflow; log1p keeps the small term's digits.
      const float hi = std::max(la, lb), lo = std::min(la, lb);
      const float l = hi + std::log1p(std::exp(lo - hi));
      const float wa = std::exp(la - l), wb = std::exp(lb - l);
      for (int64_t d = 0; d < hd; ++d) oa[d] = oa[d] * wa + ob[d] * wb;
      la = l;
    }
  }
}

}  // namespace cleave::kernels
