// Attention's forward pass (kernels/attention.h), FlashAttention-2 style, fp32 on CPU, one
// (sequence, head, query block) per task: S^T[keys, queries] = K_j (Q_i scale)^T with A = K rows
// straight from memory and B = Q_i^T packed once per task. Softmax statistics are per query = per
// column of S^T, so running max and row sums are vertical vector ops, never horizontal
// reductions. O += P V_j with A = (S^T)^T read through strides, B = V_j rows. Key blocks past the
// diagonal are skipped; diagonal blocks skip their masked half by row panel.
//
// A task reads its keys through a function from a key block's first token to its K and V: one
// piece of memory in training, a paged cache's blocks (keys transposed) in inference, widened
// first where the cache holds bf16. Every other step is the same code, so a query's result does
// not depend on where its keys lie, nor on which queries share its task (each column of S^T is
// computed alone).
#include "cleave/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cleave/kernels/attention_tiles.h"
#include "cleave/kernels/vmath.h"

namespace cleave::kernels {
namespace {

using namespace attention_tiles;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One thread's scratch for forward tasks.
struct ForwardScratch {
  float *qt, *st, *vb, *ob, *m, *l, *alpha, *s1, *kt, *vw;
  explicit ForwardScratch(int64_t hd) {
    const int64_t hdp = round_up(hd, kVL);
    qt = thread_scratch(0, hd * kFwdQ);     // [hd][kFwdQ]: scaled Q_i^T
    st = thread_scratch(1, kFwdK * kFwdQ);  // [kFwdK][kFwdQ]: S^T, then P^T
    vb = thread_scratch(2, kFwdK * hdp);    // [kFwdK][hdp]: V_j, padded (hd < hdp)
    ob = thread_scratch(3, kFwdQ * hdp);    // [kFwdQ][hdp]: unnormalised output rows
    m = thread_scratch(4, 3 * kFwdQ);       // running max per query
    l = m + kFwdQ;                          // running sum of exp(s - m) per query
    alpha = m + 2 * kFwdQ;                  // exp(m_old - m_new)
    s1 = thread_scratch(5, kFwdK);          // one query's scores, then P, over a key block
    kt = thread_scratch(6, hd * kFwdK);     // [hd][kFwdK]: a key block transposed (or widened)
    vw = thread_scratch(7, kFwdK * hdp);    // [kFwdK][hdp]: a bf16 cache's V_j widened
  }
};

// A key block: key kk's dimension d at k[kk * key_stride + d * dim_stride]; value rows at v,
// v_stride apart. fp32, or a bf16 cache's as it lies (one query's task reads it widening).
template <class E>
struct KvRowsOf {
  const E* k;
  const E* v;
  int64_t key_stride, dim_stride, v_stride;
};
using KvRows = KvRowsOf<float>;

// A key block's V rows (ld floats apart) as they lie, or copied with their padding into scratch
// where hd is not a whole number of vectors (ld becomes the padded width).
inline const float* value_rows(const float* v, int64_t& ld, int64_t nk, int64_t hd, float* scratch) {
  const int64_t hdp = round_up(hd, kVL);
  if (hdp == hd) return v;
  for (int64_t kk = 0; kk < nk; ++kk) {
    float* row = scratch + kk * hdp;
    std::memcpy(row, v + kk * ld, sizeof(float) * hd);
    for (int64_t d = hd; d < hdp; ++d) row[d] = 0.0f;
  }
  ld = hdp;
  return scratch;
}

// One task: nq <= kFwdQ query rows of one head, q its first (row stride qs), the first being
// token qa of the sequence's keys (0 .. Tk - 1); out its first output row (stride os), lse its
// first log-sum-exp (stride 1). qid and kids: the query rows' and the sequence's keys' documents
// (null: one). key_rows(k0) gives the task's kv head's KvRows of the key block from key k0.
struct ForwardTask {
  const float* q;
  int64_t qs, nq, qa, Tk;
  float* out;
  int64_t os;
  float* lse;
  const int32_t* qid;
  const int32_t* kids;
};

template <class KeyRows>
void forward_task(const ForwardTask& t, const KeyRows& key_rows, int64_t hd,
                  const ForwardScratch& w) {
  constexpr float kLowest = std::numeric_limits<float>::lowest();
  const int64_t hdp = round_up(hd, kVL), nq = t.nq, nqp = round_up(nq, kVL), qa = t.qa;
  const int64_t nkb = (t.Tk + kFwdK - 1) / kFwdK;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float *st = w.st, *ob = w.ob, *m = w.m, *l = w.l, *alpha = w.alpha;

  pack_transposed(w.qt, kFwdQ, t.q, t.qs, nq, nqp, hd, scale);
  // The running max starts finite: a query that has seen no key yet (a whole column of -inf)
  // then gets alpha = exp(0) and P = exp(-inf) = 0, not exp(-inf + inf) = NaN.
  for (int64_t i = 0; i < kFwdQ; ++i) m[i] = kLowest, l[i] = 0.0f;
  std::memset(ob, 0, sizeof(float) * kFwdQ * hdp);

  // Key blocks past the one holding the last query's token are fully masked: skipped.
  const int64_t jend = qa + nq <= 0 ? 0 : std::min(nkb, (qa + nq - 1) / kFwdK + 1);
  bool first = true;
  for (int64_t j = 0; j < jend; ++j) {
    const int64_t k0 = j * kFwdK, nk = std::min(kFwdK, t.Tk - k0);
    const Docs docs = docs_of(t.qid, nq, t.kids ? t.kids + k0 : nullptr, nk);
    if (docs == Docs::kApart) continue;
    const auto [kbase, vbase, key_stride, dim_stride, v_stride] = key_rows(k0);
    const bool diag = k0 + kFwdK - 1 > qa;  // block crosses the diagonal
    // S^T row kk (key k0+kk) is needed only for queries qa+i >= k0+kk.
    gemm<false>(st, kFwdQ, kbase, key_stride, dim_stride, w.qt, kFwdQ, nk, nqp, hd,
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
        const int32_t id = t.kids[k0 + kk];
        float* row = st + kk * kFwdQ;
        for (int64_t i = 0; i < nq; ++i) row[i] = t.qid[i] == id ? row[i] : kNegInf;
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
    int64_t ldv = v_stride;
    const float* vrows = value_rows(vbase, ldv, nk, hd, w.vb);
    // O += (P^T)^T V_j; query qa+i has non-zero P for keys k0+kk <= qa+i only.
    gemm<true>(ob, hdp, st, 1, kFwdQ, vrows, ldv, nq, hdp, nk, diag ? Tri::kKTo : Tri::kNone,
               qa - k0);
  }

  for (int64_t i = 0; i < nq; ++i) {
    float* dst = t.out + i * t.os;
    if (l[i] == 0.0f) {  // saw no key (one that it saw would add exp(0) = 1 to l)
      std::memset(dst, 0, sizeof(float) * hd);
      t.lse[i] = kNegInf;
      continue;
    }
    const float inv = 1.0f / l[i];
    const float* orow = ob + i * hdp;
    for (int64_t d = 0; d < hd; ++d) dst[d] = orow[d] * inv;
    t.lse[i] = m[i] + std::log(l[i]);
  }
}

// C[c] (+)= sum over i < n, in order, of a[i] B[i * ldb + c] for c < width (a multiple of kVL),
// fp32 or widened bf16 rows; four vectors at once, four independent FMA chains in flight instead
// of one waiting on its own latency (each still its column's sum over i in order).
template <class E>
inline void weighted_rows(float* C, bool accumulate, const float* a, const E* B, int64_t ldb,
                          int64_t n, int64_t width) {
  auto start = [&](int64_t c) { return accumulate ? loadv(C + c) : vf{}; };
  int64_t c = 0;
  for (; c + 4 * kVL <= width; c += 4 * kVL) {
    vf a0 = start(c), a1 = start(c + kVL), a2 = start(c + 2 * kVL), a3 = start(c + 3 * kVL);
    for (int64_t i = 0; i < n; ++i) {
      const E* row = B + i * ldb + c;
      const vf ai = splat(a[i]);
      a0 = fmadd(ai, loadv(row), a0);
      a1 = fmadd(ai, loadv(row + kVL), a1);
      a2 = fmadd(ai, loadv(row + 2 * kVL), a2);
      a3 = fmadd(ai, loadv(row + 3 * kVL), a3);
    }
    storev(C + c, a0), storev(C + c + kVL, a1), storev(C + c + 2 * kVL, a2), storev(C + c + 3 * kVL, a3);
  }
  for (; c < width; c += kVL) {
    vf acc = start(c);
    for (int64_t i = 0; i < n; ++i) acc = fmadd(splat(a[i]), loadv(B + i * ldb + c), acc);
    storev(C + c, acc);
  }
}

// A task of one query row (decoding): the same result, bit for bit, at a sixteenth of the work.
// forward_task spreads queries over vector lanes, so one query would fill one lane of sixteen;
// here the lanes hold keys instead, from the key block packed transposed. Every number is made
// by the same operations in the same order as there: each score is the FMA chain over d of
// K[key][d] * (q[d] * scale), the row sum adds P key by key, and P V is the same gemm (from bf16
// rows, the same sums written out: each output vector adds p[k] v[k] over k in order).
template <class KeyRows>
void forward_one_query(const ForwardTask& t, const KeyRows& key_rows, int64_t hd,
                       const ForwardScratch& w) {
  const int64_t hdp = round_up(hd, kVL), qa = t.qa;
  const int64_t nkb = (t.Tk + kFwdK - 1) / kFwdK;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float *q = w.qt, *kt = w.kt, *s = w.s1, *ob = w.ob;
  for (int64_t d = 0; d < hd; ++d) q[d] = t.q[d] * scale;
  float m = std::numeric_limits<float>::lowest(), l = 0.0f;  // finite start: see forward_task
  std::memset(ob, 0, sizeof(float) * hdp);
  const int64_t jend = qa < 0 ? 0 : std::min(nkb, qa / kFwdK + 1);
  bool first = true;
  for (int64_t j = 0; j < jend; ++j) {
    const int64_t k0 = j * kFwdK, nk = std::min(kFwdK, t.Tk - k0), nkp = round_up(nk, kVL);
    const Docs docs = docs_of(t.qid, 1, t.kids ? t.kids + k0 : nullptr, nk);
    if (docs == Docs::kApart) continue;
    const auto [kbase, vbase, key_stride, dim_stride, v_stride] = key_rows(k0);
    using E = std::remove_cvref_t<decltype(*kbase)>;
    // Keys stored transposed (a paged cache's) are read as they lie; rows are packed first.
    const E* kcols = kbase;
    int64_t ldk = dim_stride;
    if constexpr (std::is_same_v<E, float>) {
      if (key_stride != 1) {
        pack_transposed(kt, kFwdK, kbase, key_stride, nk, nkp, hd, 1.0f);
        kcols = kt, ldk = kFwdK;
      }
    }
    // Each score the FMA chain over d of its key's dimensions.
    weighted_rows(s, false, q, kcols, ldk, hd, nkp);
    const bool diag = k0 + kFwdK - 1 > qa;
    if (diag)
      for (int64_t kk = std::max<int64_t>(qa - k0 + 1, 0); kk < nk; ++kk) s[kk] = kNegInf;
    if (docs == Docs::kMixed)
      for (int64_t kk = 0; kk < nk; ++kk)
        if (t.kids[k0 + kk] != t.qid[0]) s[kk] = kNegInf;
    float m_new = m;
    for (int64_t kk = 0; kk < nk; ++kk) m_new = s[kk] > m_new ? s[kk] : m_new;
    const float alpha = vmath::exp_f(m - m_new);
    m = m_new;
    l *= alpha;
    for (int64_t kk = 0; kk < nk; ++kk) s[kk] = vmath::exp_f(s[kk] - m);
    for (int64_t kk = 0; kk < nk; ++kk) l += s[kk];
    if (!first)
      for (int64_t d = 0; d < hdp; ++d) ob[d] *= alpha;
    first = false;
    if constexpr (std::is_same_v<E, float>) {
      int64_t ldv = v_stride;
      const float* vrows = value_rows(vbase, ldv, nk, hd, w.vb);
      gemm<true>(ob, hdp, s, 1, 1, vrows, ldv, 1, hdp, nk, diag ? Tri::kKTo : Tri::kNone, qa - k0);
    } else {  // hd = hdp here: whole vectors of each row, over the keys gemm's triangle takes
      const int64_t terms = diag ? std::clamp<int64_t>(qa - k0 + 1, 0, nk) : nk;
      weighted_rows(ob, true, s, vbase, v_stride, terms, hdp);
    }
  }
  if (l == 0.0f) {
    std::memset(t.out, 0, sizeof(float) * hd);
    t.lse[0] = kNegInf;
    return;
  }
  const float inv = 1.0f / l;
  for (int64_t d = 0; d < hd; ++d) t.out[d] = ob[d] * inv;
  t.lse[0] = m + std::log(l);
}

template <class KeyRows>
void run_task(const ForwardTask& t, const KeyRows& key_rows, int64_t hd, const ForwardScratch& w) {
  if (t.nq == 1) return forward_one_query(t, key_rows, hd, w);
  forward_task(t, key_rows, hd, w);
}

void check_paged(const PagedAttention& p) {
  CLEAVE_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0 && p.head_dim > 0,
               "paged attention: n_heads=" << p.n_heads << ", n_kv_heads=" << p.n_kv_heads
                                           << ", head_dim=" << p.head_dim);
  CLEAVE_CHECK(p.q_row_stride >= int64_t(p.n_heads) * p.head_dim &&
                   p.kv_row_stride >= int64_t(p.n_kv_heads) * p.head_dim,
               "paged attention: row strides q " << p.q_row_stride << ", kv " << p.kv_row_stride
                                                 << " are shorter than their heads");
  CLEAVE_CHECK((p.k && p.v && !p.k_bf16 && !p.v_bf16) || (!p.k && !p.v && p.k_bf16 && p.v_bf16),
               "paged attention: the cache's keys and values are either fp32 or bf16, both given");
  CLEAVE_CHECK(p.block_rows > 0 && p.block_rows % kAttentionKeyBlock == 0,
               "paged attention: blocks of " << p.block_rows << " rows; they must hold a multiple of "
                                             << kAttentionKeyBlock);
  CLEAVE_CHECK(p.sequences >= 0 && p.rows && p.rows[0] == 0 && (p.sequences == 0 || (p.past && p.blocks)),
               "paged attention: a batch of " << p.sequences << " sequences without its row table");
  for (int64_t s = 0; s < p.sequences; ++s)
    CLEAVE_CHECK(p.rows[s + 1] >= p.rows[s] && p.past[s] >= 0 && p.blocks[s],
                 "paged attention: sequence " << s << " has rows [" << p.rows[s] << ", "
                                              << p.rows[s + 1] << "), past " << p.past[s]);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& s) {
  check_shape(s);
  CLEAVE_CHECK(out && lse && q && k && v, "attention_forward: null pointer");
  const int64_t Tq = s.T, Tk = s.keys(), H = s.n_heads, hd = s.head_dim, qs = s.q_row_stride,
                kvs = s.kv_row_stride, group = s.n_heads / s.n_kv_heads;
  const int64_t shift = s.q_begin - s.k_begin;  // query row i is the token of key row i + shift
  const int64_t nqb = (Tq + kFwdQ - 1) / kFwdQ;
  const int64_t tasks = s.B * H * nqb;

#pragma omp parallel
  {
    const ForwardScratch w(hd);
    // Causal cost grows with the query block index: dynamic scheduling, largest blocks first.
    // Each task's result depends only on its inputs, so the schedule does not change the output.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t ib = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / H, h = bh % H, kvh = h / group;
      const int64_t q0 = ib * kFwdQ;
      const ForwardTask t{q + (b * Tq + q0) * qs + h * hd,
                          qs,
                          std::min(kFwdQ, Tq - q0),
                          q0 + shift,
                          Tk,
                          out + ((b * Tq + q0) * H + h) * hd,
                          H * hd,
                          lse + (b * H + h) * Tq + q0,
                          s.q_seq ? s.q_seq + b * Tq + q0 : nullptr,
                          s.k_seq ? s.k_seq + b * Tk : nullptr};
      const int64_t first_key = b * Tk * kvs + kvh * hd;
      run_task(
          t,
          [&](int64_t k0) {
            return KvRows{k + first_key + k0 * kvs, v + first_key + k0 * kvs, kvs, 1, kvs};
          },
          hd, w);
    }
  }
}

void attention_forward_paged(float* out, float* lse, const float* q, const PagedAttention& p) {
  check_paged(p);
  const int64_t H = p.n_heads, hd = p.head_dim, group = p.n_heads / p.n_kv_heads;
  const int64_t N = p.rows[p.sequences], kvs = p.kv_row_stride, block = p.block_rows * kvs;
  // Tasks in order of (sequence, query block), then head: first_task[s] is sequence s's first.
  std::vector<int64_t> first_task(size_t(p.sequences) + 1, 0);
  for (int64_t s = 0; s < p.sequences; ++s)
    first_task[size_t(s) + 1] = first_task[size_t(s)] + (p.rows[s + 1] - p.rows[s] + kFwdQ - 1) / kFwdQ * H;
  const int64_t tasks = first_task.back();

#pragma omp parallel
  {
    const ForwardScratch w(hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t s = std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
      const int64_t local = task - first_task[size_t(s)], ib = local / H, h = local % H;
      const int64_t row = p.rows[s] + ib * kFwdQ, kvh = h / group;
      const ForwardTask t{q + row * p.q_row_stride + h * hd,
                          p.q_row_stride,
                          std::min(kFwdQ, p.rows[s + 1] - row),
                          p.past[s] + ib * kFwdQ,
                          p.past[s] + p.rows[s + 1] - p.rows[s],
                          out + (row * H + h) * hd,
                          H * hd,
                          lse + h * N + row,
                          nullptr,
                          nullptr};
      const int32_t* table = p.blocks[s];
      const int64_t column = kvh * hd, br = p.block_rows;
      // The task's kv head's rows of the key block from key k0, where they lie in the pool.
      const auto lying = [&]<class E>(const E* k, const E* v, int64_t k0) {
        const int64_t b = int64_t(table[k0 / br]) * block, i = k0 % br;
        return KvRowsOf<E>{k + b + column * br + i, v + b + i * kvs + column, 1, br, kvs};
      };
      if (!p.k_bf16) {
        run_task(t, [&](int64_t k0) { return lying(p.k, p.v, k0); }, hd, w);
        continue;
      }
      // One query reads a bf16 cache as it lies (half the bytes of fp32 from memory), widening
      // each vector as it loads it; its value rows need whole vectors (hd a multiple of kVL).
      if (t.nq == 1 && hd % kVL == 0) {
        forward_one_query(t, [&](int64_t k0) { return lying(p.k_bf16, p.v_bf16, k0); }, hd, w);
        continue;
      }
      run_task(
          t,
          [&](int64_t k0) {
            const KvRowsOf<bf16> rows = lying(p.k_bf16, p.v_bf16, k0);
            // bf16 -> fp32 is exact: the block's keys and values as they were rounded, each key
            // dimension a row of kFwdK as the transposed cache has it, rows past the sequence zero
            // (the kernels read whole vectors of them and mask their scores).
            const int64_t nk = std::min(kFwdK, t.Tk - k0), hdp = round_up(hd, kVL);
            for (int64_t d = 0; d < hd; ++d) {
              const bf16* from = rows.k + d * rows.dim_stride;
              float* to = w.kt + d * kFwdK;
              for (int64_t kk = 0; kk < nk; ++kk) to[kk] = from_bf16(from[kk]);
              for (int64_t kk = nk; kk < kFwdK; ++kk) to[kk] = 0.0f;
            }
            for (int64_t kk = 0; kk < nk; ++kk) {
              const bf16* from = rows.v + kk * rows.v_stride;
              float* to = w.vw + kk * hdp;
              for (int64_t d = 0; d < hd; ++d) to[d] = from_bf16(from[d]);
              for (int64_t d = hd; d < hdp; ++d) to[d] = 0.0f;
            }
            return KvRows{w.kt, w.vw, 1, kFwdK, hdp};
          },
          hd, w);
    }
  }
}

}  // namespace cleave::kernels
