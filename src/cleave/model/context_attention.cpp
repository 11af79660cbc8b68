#include "cleave/model/context_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "cleave/base/check.h"
#include "cleave/model/saved_bytes.h"

namespace cleave {

namespace {

// A key chunk wholly in documents before the query chunk's first (ids do not decrease along a
// sequence): the mask empties the pair, which is skipped whole, merge and all.
bool apart(const kernels::AttentionShape& s, int64_t c) {
  return s.q_seq && s.k_begin < s.q_begin && s.k_seq[c - 1] < s.q_seq[0];
}

}  // namespace

struct ContextAttention::Geometry {
  int64_t B, T, c;     // sequences, this rank's rows per sequence, rows per chunk (T / 2)
  int64_t T_full;      // tokens per whole sequence
  int64_t rows;        // this rank's rows, B * T
  int64_t set_rows;    // the rows of one ring position: its Ulysses group's, U * B * T
  int64_t q_cols, kv_cols;  // per row of A: this rank's q heads' and kv heads' floats
  int64_t dim;         // A's row: q_cols + 2 kv_cols
  int pos;             // this rank's ring position
  // Row of member i's sequence b, chunk half h, in A (and in a ring position's K|V rows), and
  // the index of that chunk's [heads, c] block of log-sum-exps.
  int64_t row(int i, int64_t b, int h) const { return (i * B + b) * T + h * c; }
  int64_t entry(int i, int64_t b, int h) const { return (i * B + b) * 2 + h; }
};

void ContextAttention::Saved::release() {
  for (Buffer<float>* b : {&qkv_u, &lse}) *b = Buffer<float>();
}

ContextAttention::ContextAttention(const ContextParallelOptions& o, int heads, int kv_heads,
                                   int head_dim)
    : opt_(o), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
  if (!opt_.work) opt_.work = std::make_shared<ContextWork>();
  U_ = o.ulysses ? o.ulysses->size() : 1;
  R_ = o.ring ? o.ring->size() : 1;
  CLEAVE_CHECK(U_ * R_ == o.cp, "context parallelism: a Ulysses group of " << U_ << " x a ring of "
                                    << R_ << " ranks is not parallel.cp = " << o.cp);
  // plan_layout (parallel/layout.cpp) reports these to the user, naming the config keys.
  CLEAVE_CHECK(heads % U_ == 0, heads << " query heads do not divide over " << U_
                                      << " Ulysses ranks");
  CLEAVE_CHECK(kv_heads % U_ == 0 || U_ % kv_heads == 0,
               kv_heads << " kv heads neither divide over " << U_ << " Ulysses ranks nor divide it");
  kv_split_ = kv_heads % U_ == 0;
  heads_u_ = heads / U_;
  kv_heads_u_ = kv_split_ ? kv_heads / U_ : 1;
}

int ContextAttention::kv_first(int member) const {
  return kv_split_ ? member * kv_heads_u_ : member * heads_u_ / (heads_ / kv_heads_);
}

ContextAttention::Geometry ContextAttention::geometry(int64_t B, int64_t T) const {
  CLEAVE_CHECK(T % 2 == 0, "context parallelism: a rank's " << T << " tokens per sequence are "
                                                            << "not two equal chunks");
  Geometry g;
  g.B = B, g.T = T, g.c = T / 2, g.T_full = T * opt_.cp, g.rows = B * T, g.set_rows = U_ * B * T;
  g.q_cols = int64_t(heads_u_) * head_dim_;
  g.kv_cols = int64_t(kv_heads_u_) * head_dim_;
  g.dim = g.q_cols + 2 * g.kv_cols;
  g.pos = opt_.ring ? opt_.ring->rank() : 0;
  return g;
}

int64_t ContextAttention::saved_bytes(int64_t N) const {
  // The log-sum-exps of every head's rows, and under Ulysses its own q|k|v (every member's rows
  // of this rank's heads).
  const int64_t qkv_u = U_ > 1 ? U_ * N * (heads_u_ + 2 * int64_t(kv_heads_u_)) * head_dim_ : 0;
  return (N * heads_ + qkv_u) * kFloatBytes;
}

void ContextAttention::pack_kv(const Geometry& g, float* kv, const float* A) const {
  for (int64_t r = 0; r < g.set_rows; ++r)
    std::memcpy(kv + r * 2 * g.kv_cols, A + r * g.dim + g.q_cols, 2 * g.kv_cols * sizeof(float));
}

void ContextAttention::unpack_kv(const Geometry& g, float* dA, const float* dkv) const {
  for (int64_t r = 0; r < g.set_rows; ++r)
    std::memcpy(dA + r * g.dim + g.q_cols, dkv + r * 2 * g.kv_cols, 2 * g.kv_cols * sizeof(float));
}

void ContextAttention::permute(const Geometry& g, float* dst, const float* src, int64_t cols,
                               int members, bool to_global) const {
  for (int m = 0; m < members; ++m)
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t mine = g.row(m, b, h), global = b * g.T_full + zigzag_chunk(opt_.cp, m, h) * g.c;
        const int64_t from = to_global ? mine : global, to = to_global ? global : mine;
        std::memcpy(dst + to * cols, src + from * cols, g.c * cols * sizeof(float));
      }
}

void ContextAttention::scatter_heads(const Geometry& g, float* A, const float* qkv, int64_t cols_q,
                                     int64_t cols_kv, Buffer<float>& send) {
  const int64_t hd = head_dim_, src_dim = int64_t(heads_ + 2 * kv_heads_) * hd;
  const int64_t src_row = cols_kv ? src_dim : int64_t(heads_) * hd;
  const int64_t dim = cols_q + 2 * cols_kv;
  send.grow(U_ * g.rows * dim);
  for (int j = 0; j < U_; ++j)
    for (int64_t r = 0; r < g.rows; ++r) {
      const float* src = qkv + r * src_row;
      float* dst = send.data() + (j * g.rows + r) * dim;
      std::memcpy(dst, src + j * cols_q, cols_q * sizeof(float));
      if (!cols_kv) continue;
      const int64_t k0 = int64_t(heads_) * hd + kv_first(j) * hd;
      std::memcpy(dst + cols_q, src + k0, cols_kv * sizeof(float));
      std::memcpy(dst + cols_q + cols_kv, src + k0 + int64_t(kv_heads_) * hd, cols_kv * sizeof(float));
    }
  opt_.ulysses->all_to_all(send.data(), A, g.rows * dim)();
}

void ContextAttention::gather_heads(const Geometry& g, float* qkv, const float* A, int64_t cols_q,
                                    int64_t cols_kv, bool sum_kv, Buffer<float>& recv) {
  const int64_t hd = head_dim_, dst_dim = int64_t(heads_ + 2 * kv_heads_) * hd;
  const int64_t dst_row = cols_kv ? dst_dim : int64_t(heads_) * hd;
  const int64_t dim = cols_q + 2 * cols_kv;
  recv.grow(U_ * g.rows * dim);
  opt_.ulysses->all_to_all(A, recv.data(), g.rows * dim)();
  if (sum_kv)
    for (int64_t r = 0; r < g.rows; ++r)
      std::fill_n(qkv + r * dst_row + int64_t(heads_) * hd, 2 * int64_t(kv_heads_) * hd, 0.0f);
  for (int j = 0; j < U_; ++j)
    for (int64_t r = 0; r < g.rows; ++r) {
      const float* src = recv.data() + (j * g.rows + r) * dim;
      float* dst = qkv + r * dst_row;
      std::memcpy(dst + j * cols_q, src, cols_q * sizeof(float));
      if (!cols_kv) continue;
      float* k = dst + int64_t(heads_) * hd + kv_first(j) * hd;
      float* v = k + int64_t(kv_heads_) * hd;
      if (sum_kv) {
        for (int64_t e = 0; e < cols_kv; ++e) k[e] += src[cols_q + e];
        for (int64_t e = 0; e < cols_kv; ++e) v[e] += src[cols_q + cols_kv + e];
      } else {
        std::memcpy(k, src + cols_q, cols_kv * sizeof(float));
        std::memcpy(v, src + cols_q + cols_kv, cols_kv * sizeof(float));
      }
    }
}

kernels::AttentionShape ContextAttention::chunk_shape(const Geometry& g) const {
  kernels::AttentionShape shape{1, g.c, heads_u_, kv_heads_u_, head_dim_, g.dim, 2 * g.kv_cols};
  shape.Tk = g.c;
  return shape;
}

// Every pair of a query chunk of this rank's rows with a key chunk of ring position owner's
// K|V rows that attention computes: key chunks at or before the query chunk, and not emptied
// whole by the document mask. f(q_row, lse_at, k_at, shape): the query chunk's first row in A,
// its log-sum-exps' offset, the key chunk's first float in the K|V rows, the pair's shape.
template <class F>
void ContextAttention::for_each_pair(const Geometry& g, int owner, const int32_t* documents,
                                     F&& f) const {
  kernels::AttentionShape shape = chunk_shape(g);
  for (int i = 0; i < U_; ++i)
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t qc = zigzag_chunk(opt_.cp, g.pos * U_ + i, h);
        shape.q_begin = qc * g.c;
        shape.q_seq = documents ? documents + b * g.T_full + qc * g.c : nullptr;
        for (int ik = 0; ik < U_; ++ik)
          for (int hk = 0; hk < 2; ++hk) {
            const int64_t kc = zigzag_chunk(opt_.cp, owner * U_ + ik, hk);
            if (kc > qc) continue;  // wholly in the future of every query of the chunk
            shape.k_begin = kc * g.c;
            shape.k_seq = documents ? documents + b * g.T_full + kc * g.c : nullptr;
            if (apart(shape, g.c)) continue;
            f(g.row(i, b, h), g.entry(i, b, h) * heads_u_ * g.c,
              g.row(ik, b, hk) * 2 * g.kv_cols, shape);
          }
      }
}

void ContextAttention::pairs_forward(const Geometry& g, const float* A, float* O, float* lse,
                                     const float* kv, int owner, const int32_t* documents) {
  ContextWork& w = *opt_.work;
  for_each_pair(g, owner, documents,
                [&](int64_t q_row, int64_t lse_at, int64_t k_at,
                    const kernels::AttentionShape& shape) {
                  kernels::attention_forward(w.out_part.data(), w.lse_part.data(),
                                             A + q_row * g.dim, kv + k_at, kv + k_at + g.kv_cols,
                                             shape);
                  kernels::attention_merge(O + q_row * g.q_cols, lse + lse_at, w.out_part.data(),
                                           w.lse_part.data(), shape);
                });
}

void ContextAttention::pairs_backward(const Geometry& g, const float* A, float* dA, const float* O,
                                      const float* lse, const float* dO, const float* kv,
                                      float* dkv, int owner, const int32_t* documents) {
  for_each_pair(g, owner, documents,
                [&](int64_t q_row, int64_t lse_at, int64_t k_at,
                    const kernels::AttentionShape& shape) {
                  kernels::attention_backward(dA + q_row * g.dim, dkv + k_at,
                                              dkv + k_at + g.kv_cols, dO + q_row * g.q_cols,
                                              A + q_row * g.dim, kv + k_at, kv + k_at + g.kv_cols,
                                              O + q_row * g.q_cols, lse + lse_at, shape, true);
                });
}

// The rank's query chunks over the whole sequence's K|V rows in order (allgather): one call per
// chunk over every key before its end, no merge.
kernels::AttentionShape ContextAttention::prefix_shape(const Geometry& g, int64_t qc,
                                                       int64_t b, const int32_t* documents) const {
  kernels::AttentionShape shape = chunk_shape(g);
  shape.Tk = (qc + 1) * g.c;
  shape.q_begin = qc * g.c;
  shape.k_begin = 0;
  shape.q_seq = documents ? documents + b * g.T_full + qc * g.c : nullptr;
  shape.k_seq = documents ? documents + b * g.T_full : nullptr;
  return shape;
}

void ContextAttention::gather_kv(const Geometry& g, const float* A) {
  ContextWork& w = *opt_.work;
  const int64_t kv_floats = g.set_rows * 2 * g.kv_cols;
  w.kv.grow(kv_floats);
  w.grads.grow(R_ * kv_floats);  // the gathered rows, rank by rank, until they are in order
  w.rows.grow(R_ * kv_floats);
  pack_kv(g, w.kv.data(), A);
  opt_.ring->all_gather(w.kv.data(), w.grads.data(), kv_floats)();
  permute(g, w.rows.data(), w.grads.data(), 2 * g.kv_cols, R_, true);
}

void ContextAttention::forward(AttentionCore::Saved& saved, float* o, const float* qkv,
                               const Rows& rows) {
  Saved& s = static_cast<Saved&>(saved);
  const int64_t B = rows.B, T = rows.T;
  const int32_t* documents = rows.sequence_documents;
  const Geometry g = geometry(B, T);
  ContextWork& w = *opt_.work;
  s.lse.fit(g.set_rows * heads_u_);
  if (opt_.mode == CpMode::ulysses) {
    // The whole sequence of this rank's heads, in order: one causal attention, as one process.
    w.rows.grow(g.set_rows * g.dim);
    scatter_heads(g, w.rows.data(), qkv, g.q_cols, g.kv_cols, w.grads);
    s.qkv_u.fit(g.set_rows * g.dim);
    w.out.grow(g.set_rows * g.q_cols);
    permute(g, s.qkv_u.data(), w.rows.data(), g.dim, U_, true);
    const float* A = s.qkv_u.data();
    kernels::AttentionShape shape{g.B, g.T_full, heads_u_, kv_heads_u_, head_dim_, g.dim, g.dim};
    shape.q_seq = shape.k_seq = documents;
    kernels::attention_forward(w.out.data(), s.lse.data(), A, A + g.q_cols,
                               A + g.q_cols + g.kv_cols, shape);
    w.rows.grow(g.set_rows * g.q_cols);
    permute(g, w.rows.data(), w.out.data(), g.q_cols, U_, false);
    gather_heads(g, o, w.rows.data(), g.q_cols, 0, false, w.grads);
    return;
  }
  if (opt_.mode == CpMode::allgather) {
    gather_kv(g, qkv);
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t qc = zigzag_chunk(opt_.cp, g.pos, h), row = g.row(0, b, h);
        const float* k = w.rows.data() + b * g.T_full * 2 * g.kv_cols;
        kernels::attention_forward(o + row * g.q_cols, s.lse.data() + g.entry(0, b, h) * heads_u_ * g.c,
                                   qkv + row * g.dim, k, k + g.kv_cols,
                                   prefix_shape(g, qc, b, documents));
      }
    return;
  }
  // ring and hybrid: at step t this rank holds ring position pos - t's K|V rows (its Ulysses
  // group's); the next ones travel meanwhile.
  const float* A = qkv;
  float* O = o;
  if (U_ > 1) {
    s.qkv_u.fit(g.set_rows * g.dim);
    w.out.grow(g.set_rows * g.q_cols);
    scatter_heads(g, s.qkv_u.data(), qkv, g.q_cols, g.kv_cols, w.rows);
    A = s.qkv_u.data();
    O = w.out.data();
  }
  std::fill_n(O, g.set_rows * g.q_cols, 0.0f);
  std::fill_n(s.lse.data(), s.lse.size(), -std::numeric_limits<float>::infinity());
  w.out_part.grow(g.c * g.q_cols);
  w.lse_part.grow(g.c * heads_u_);
  const int64_t kv_floats = g.set_rows * 2 * g.kv_cols;
  w.kv.grow(kv_floats);
  w.kv_next.grow(kv_floats);
  pack_kv(g, w.kv.data(), A);
  for (int t = 0; t < R_; ++t) {
    CpComm::Wait arrived;
    if (t + 1 < R_) arrived = opt_.ring->ring_shift(w.kv.data(), w.kv_next.data(), kv_floats);
    pairs_forward(g, A, O, s.lse.data(), w.kv.data(), (g.pos - t + R_) % R_, documents);
    if (arrived) {
      arrived();
      std::swap(w.kv, w.kv_next);
    }
  }
  if (U_ > 1) gather_heads(g, o, O, g.q_cols, 0, false, w.rows);
}

void ContextAttention::backward(AttentionCore::Saved& saved, float* d_qkv, const float* d_o,
                                const float* qkv, const float* o, const Rows& rows) {
  Saved& s = static_cast<Saved&>(saved);
  const int64_t B = rows.B, T = rows.T;
  const int32_t* documents = rows.sequence_documents;
  const Geometry g = geometry(B, T);
  ContextWork& w = *opt_.work;
  if (opt_.mode == CpMode::ulysses) {
    // The output in attention's layout again (kept by no layer: the rank's rows of it are).
    w.rows.grow(g.set_rows * g.q_cols);
    scatter_heads(g, w.rows.data(), o, g.q_cols, 0, w.grads);
    w.out.grow(g.set_rows * g.q_cols);
    permute(g, w.out.data(), w.rows.data(), g.q_cols, U_, true);
    scatter_heads(g, w.rows.data(), d_o, g.q_cols, 0, w.grads);
    w.grads.grow(g.set_rows * g.q_cols);
    permute(g, w.grads.data(), w.rows.data(), g.q_cols, U_, true);
    w.rows.grow(g.set_rows * g.dim);
    const float* A = s.qkv_u.data();
    float* dA = w.rows.data();
    kernels::AttentionShape shape{g.B, g.T_full, heads_u_, kv_heads_u_, head_dim_, g.dim, g.dim};
    shape.q_seq = shape.k_seq = documents;
    kernels::attention_backward(dA, dA + g.q_cols, dA + g.q_cols + g.kv_cols, w.grads.data(), A,
                                A + g.q_cols, A + g.q_cols + g.kv_cols, w.out.data(),
                                s.lse.data(), shape);
    w.grads.grow(g.set_rows * g.dim);
    permute(g, w.grads.data(), dA, g.dim, U_, false);
    gather_heads(g, d_qkv, w.grads.data(), g.q_cols, g.kv_cols, !kv_split_, w.rows);
    return;
  }
  const int64_t kv_floats = g.set_rows * 2 * g.kv_cols;
  if (opt_.mode == CpMode::allgather) {
    // K|V gathered again (kept by no layer: cp x their rows would be), their gradients summed
    // over the query chunks of every rank and reduce-scattered back to their owners.
    gather_kv(g, qkv);
    std::fill_n(d_qkv, g.set_rows * g.dim, 0.0f);
    std::fill_n(w.grads.data(), R_ * kv_floats, 0.0f);
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t qc = zigzag_chunk(opt_.cp, g.pos, h), row = g.row(0, b, h);
        const int64_t k_at = b * g.T_full * 2 * g.kv_cols;
        const float* k = w.rows.data() + k_at;
        float* dk = w.grads.data() + k_at;
        kernels::attention_backward(d_qkv + row * g.dim, dk, dk + g.kv_cols, d_o + row * g.q_cols,
                                    qkv + row * g.dim, k, k + g.kv_cols, o + row * g.q_cols,
                                    s.lse.data() + g.entry(0, b, h) * heads_u_ * g.c,
                                    prefix_shape(g, qc, b, documents), true);
      }
    // Rank by rank again, into the K|V rows' buffer (they are done with), for the reduce-scatter.
    permute(g, w.rows.data(), w.grads.data(), 2 * g.kv_cols, R_, false);
    w.dkv.grow(kv_floats);
    opt_.ring->reduce_scatter(w.rows.data(), w.dkv.data(), kv_floats)();
    unpack_kv(g, d_qkv, w.dkv.data());
    return;
  }
  const float* A = U_ > 1 ? s.qkv_u.data() : qkv;
  const float* O = o;
  const float* dO = d_o;
  float* dA = d_qkv;
  if (U_ > 1) {
    w.out.grow(g.set_rows * g.q_cols);  // the output in attention's layout again
    scatter_heads(g, w.out.data(), o, g.q_cols, 0, w.rows);
    O = w.out.data();
    w.grads.grow(g.set_rows * g.q_cols);
    scatter_heads(g, w.grads.data(), d_o, g.q_cols, 0, w.rows);
    dO = w.grads.data();
    w.rows.grow(g.set_rows * g.dim);
    dA = w.rows.data();
  }
  std::fill_n(dA, g.set_rows * g.dim, 0.0f);
  // K|V travel the ring again, and behind them an accumulator of their gradients per owner:
  // at step t this rank computes its part for the K|V in hand while the accumulator for them
  // (from the rank before, which finished its part a step ago) and the next K|V arrive, then
  // adds its part and passes the accumulator on. After R steps each is back at its owner.
  w.kv.grow(kv_floats);
  w.kv_next.grow(kv_floats);
  w.dkv.grow(kv_floats);
  w.dkv_next.grow(kv_floats);
  w.dkv_part.grow(R_ > 1 ? kv_floats : 0);
  pack_kv(g, w.kv.data(), A);
  std::fill_n(w.dkv.data(), kv_floats, 0.0f);
  for (int t = 0; t < R_; ++t) {
    CpComm::Wait kv_arrived, acc_arrived;
    if (t + 1 < R_) kv_arrived = opt_.ring->ring_shift(w.kv.data(), w.kv_next.data(), kv_floats);
    if (t > 0) {
      acc_arrived = opt_.ring->ring_shift(w.dkv.data(), w.dkv_next.data(), kv_floats);
      std::fill_n(w.dkv_part.data(), kv_floats, 0.0f);
    }
    float* part = t > 0 ? w.dkv_part.data() : w.dkv.data();
    pairs_backward(g, A, dA, O, s.lse.data(), dO, w.kv.data(), part, (g.pos - t + R_) % R_,
                   documents);
    if (acc_arrived) {
      acc_arrived();
      float* acc = w.dkv_next.data();
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < kv_floats; ++i) acc[i] += part[i];
      std::swap(w.dkv, w.dkv_next);
    }
    if (kv_arrived) {
      kv_arrived();
      std::swap(w.kv, w.kv_next);
    }
  }
  if (R_ > 1) {  // the last accumulator goes home
    opt_.ring->ring_shift(w.dkv.data(), w.dkv_next.data(), kv_floats)();
    std::swap(w.dkv, w.dkv_next);
  }
  unpack_kv(g, dA, w.dkv.data());
  if (U_ > 1) gather_heads(g, d_qkv, dA, g.q_cols, g.kv_cols, !kv_split_, w.grads);
}

CpMode parse_cp_mode(const std::string& name) {
  if (name == "ring") return CpMode::ring;
  if (name == "allgather") return CpMode::allgather;
  if (name == "ulysses") return CpMode::ulysses;
  if (name == "hybrid") return CpMode::hybrid;
  throw Error("parallel.cp_mode = \"" + name +
              "\" is not a context-parallel mode (ring, allgather, ulysses, hybrid)");
}

const char* cp_mode_name(CpMode m) {
  switch (m) {
    case CpMode::ring: return "ring";
    case CpMode::allgather: return "allgather";
    case CpMode::ulysses: return "ulysses";
    case CpMode::hybrid: return "hybrid";
  }
  return "?";
}

}  // namespace cleave
