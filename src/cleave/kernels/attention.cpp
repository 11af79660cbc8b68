// Attention's backward pass and ring attention's merge (kernels/attention.h); forward is in
// attention_forward.cpp, the block products both use in attention_tiles.h.
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
#include "cleave/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cleave/kernels/attention_tiles.h"
#include "cleave/kernels/vmath.h"

namespace cleave::kernels {

using namespace attention_tiles;

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
