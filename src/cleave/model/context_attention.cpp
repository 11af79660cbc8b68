#include "cleave/model/context_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "cleave/base/check.h"

namespace cleave {

struct ContextAttention::Geometry {
  int64_t B, T, c;     // sequences, this rank's rows per sequence, rows per chunk (T / 2)
  int64_t T_full;      // tokens per whole sequence
  int64_t rows;        // this rank's rows, B * T
  int64_t set_rows;    // the rows of one ring position: its Ulysses group's, U * B * T
  int64_t q_cols, kv_cols;  // per row of A: this rank's q heads' and kv heads' floats
  int64_t dim;         // A's row: q_cols + 2 kv_cols
  int pos;             // this rank's ring position
  // Row of member i's sequence b, chunk half h, in A (and in a ring position's K|V rows).
  int64_t row(int i, int64_t b, int h) const { return (i * B + b) * T + h * c; }
};

void ContextAttention::Saved::release() {
  for (Buffer<float>* b : {&qkv_u, &o_u, &lse, &kv_all}) *b = Buffer<float>();
}

ContextAttention::ContextAttention(const ContextParallelOptions& o, int heads, int kv_heads,
                                   int head_dim)
    : opt_(o), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim) {
  U_ = o.ulysses ? o.ulysses->size() : 1;
  R_ = o.ring ? o.ring->size() : 1;
  CLEAVE_CHECK(U_ * R_ == o.cp, "context parallelism: a Ulysses group of " << U_ << " x a ring of "
                                    << R_ << " ranks is not parallel.cp = " << o.cp);
  if (U_ > 1 && heads % U_ != 0)
    throw Error("parallel.cp_mode = " + std::string(cp_mode_name(o.mode)) + ": the " +
                std::to_string(heads) + " query heads of a rank (after tp) do not divide over " +
                std::to_string(U_) + " Ulysses ranks");
  if (U_ > 1 && kv_heads % U_ != 0 && U_ % kv_heads != 0)
    throw Error("parallel.cp_mode = " + std::string(cp_mode_name(o.mode)) + ": the " +
                std::to_string(kv_heads) + " kv heads of a rank (after tp) neither divide over " +
                std::to_string(U_) + " Ulysses ranks nor divide " + std::to_string(U_) +
                " (to be replicated)");
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

void ContextAttention::pack_kv(const Geometry& g, float* kv, const float* A) const {
  for (int64_t r = 0; r < g.set_rows; ++r)
    std::memcpy(kv + r * 2 * g.kv_cols, A + r * g.dim + g.q_cols, 2 * g.kv_cols * sizeof(float));
}

void ContextAttention::unpack_kv(const Geometry& g, float* dA, const float* dkv) const {
  for (int64_t r = 0; r < g.set_rows; ++r)
    std::memcpy(dA + r * g.dim + g.q_cols, dkv + r * 2 * g.kv_cols, 2 * g.kv_cols * sizeof(float));
}

void ContextAttention::pairs_forward(const Geometry& g, const float* A, float* O, float* lse,
                                     const float* kv, int owner, int sets,
                                     const int32_t* documents) {
  kernels::AttentionShape shape{1, g.c, heads_u_, kv_heads_u_, head_dim_, g.dim, 2 * g.kv_cols};
  shape.Tk = g.c;
  for (int i = 0; i < U_; ++i)
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t qc = zigzag_chunk(opt_.cp, g.pos * U_ + i, h), q_row = g.row(i, b, h);
        float* o = O + q_row * g.q_cols;
        float* l = lse + ((i * g.B + b) * 2 + h) * heads_u_ * g.c;
        shape.q_begin = qc * g.c;
        shape.q_seq = documents ? documents + b * g.T_full + qc * g.c : nullptr;
        for (int s = 0; s < sets; ++s) {
          const int at = (owner + s) % R_;
          const float* set = kv + s * g.set_rows * 2 * g.kv_cols;
          for (int ik = 0; ik < U_; ++ik)
            for (int hk = 0; hk < 2; ++hk) {
              const int64_t kc = zigzag_chunk(opt_.cp, at * U_ + ik, hk);
              if (kc > qc) continue;  // wholly in the future of every query of the chunk
              const float* k = set + g.row(ik, b, hk) * 2 * g.kv_cols;
              shape.k_begin = kc * g.c;
              shape.k_seq = documents ? documents + b * g.T_full + kc * g.c : nullptr;
              kernels::attention_forward(out_tmp_.data(), lse_tmp_.data(), A + q_row * g.dim, k,
                                         k + g.kv_cols, shape);
              kernels::attention_merge(o, l, out_tmp_.data(), lse_tmp_.data(), shape);
            }
        }
      }
}

void ContextAttention::pairs_backward(const Geometry& g, const float* A, float* dA, const float* O,
                                      const float* lse, const float* dO, const float* kv,
                                      float* dkv, int owner, int sets,
                                      const int32_t* documents) {
  kernels::AttentionShape shape{1, g.c, heads_u_, kv_heads_u_, head_dim_, g.dim, 2 * g.kv_cols};
  shape.Tk = g.c;
  for (int i = 0; i < U_; ++i)
    for (int64_t b = 0; b < g.B; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t qc = zigzag_chunk(opt_.cp, g.pos * U_ + i, h), q_row = g.row(i, b, h);
        const float* l = lse + ((i * g.B + b) * 2 + h) * heads_u_ * g.c;
        shape.q_begin = qc * g.c;
        shape.q_seq = documents ? documents + b * g.T_full + qc * g.c : nullptr;
        for (int s = 0; s < sets; ++s) {
          const int at = (owner + s) % R_;
          const int64_t set = s * g.set_rows * 2 * g.kv_cols;
          for (int ik = 0; ik < U_; ++ik)
            for (int hk = 0; hk < 2; ++hk) {
              const int64_t kc = zigzag_chunk(opt_.cp, at * U_ + ik, hk);
              if (kc > qc) continue;
              const int64_t k_at = set + g.row(ik, b, hk) * 2 * g.kv_cols;
              shape.k_begin = kc * g.c;
              shape.k_seq = documents ? documents + b * g.T_full + kc * g.c : nullptr;
              kernels::attention_backward(dA + q_row * g.dim, dkv + k_at, dkv + k_at + g.kv_cols,
                                          dO + q_row * g.q_cols, A + q_row * g.dim, kv + k_at,
                                          kv + k_at + g.kv_cols, O + q_row * g.q_cols, l, shape,
                                          true);
            }
        }
      }
}

void ContextAttention::scatter_heads(const Geometry& g, float* A, const float* qkv, int64_t cols_q,
                                     int64_t cols_kv) {
  const int64_t hd = head_dim_, src_dim = int64_t(heads_ + 2 * kv_heads_) * hd;
  const int64_t src_row = cols_kv ? src_dim : int64_t(heads_) * hd;
  const int64_t dim = cols_q + 2 * cols_kv;
  send_.resize(U_ * g.rows * dim);
  for (int j = 0; j < U_; ++j)
    for (int64_t r = 0; r < g.rows; ++r) {
      const float* src = qkv + r * src_row;
      float* dst = send_.data() + (j * g.rows + r) * dim;
      std::memcpy(dst, src + j * cols_q, cols_q * sizeof(float));
      if (!cols_kv) continue;
      const int64_t k0 = int64_t(heads_) * hd + kv_first(j) * hd;
      std::memcpy(dst + cols_q, src + k0, cols_kv * sizeof(float));
      std::memcpy(dst + cols_q + cols_kv, src + k0 + int64_t(kv_heads_) * hd, cols_kv * sizeof(float));
    }
  opt_.ulysses->all_to_all(send_.data(), A, g.rows * dim)();
}

void ContextAttention::gather_heads(const Geometry& g, float* qkv, const float* A, int64_t cols_q,
                                    int64_t cols_kv, bool sum_kv) {
  const int64_t hd = head_dim_, dst_dim = int64_t(heads_ + 2 * kv_heads_) * hd;
  const int64_t dst_row = cols_kv ? dst_dim : int64_t(heads_) * hd;
  const int64_t dim = cols_q + 2 * cols_kv;
  recv_.resize(U_ * g.rows * dim);
  opt_.ulysses->all_to_all(A, recv_.data(), g.rows * dim)();
  if (sum_kv)
    for (int64_t r = 0; r < g.rows; ++r)
      std::fill_n(qkv + r * dst_row + int64_t(heads_) * hd, 2 * int64_t(kv_heads_) * hd, 0.0f);
  for (int j = 0; j < U_; ++j)
    for (int64_t r = 0; r < g.rows; ++r) {
      const float* src = recv_.data() + (j * g.rows + r) * dim;
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

void ContextAttention::forward(Saved& s, float* o, const float* qkv, int64_t B, int64_t T,
                               const int32_t* documents) {
  const Geometry g = geometry(B, T);
  const float* A = qkv;
  float* O = o;
  if (U_ > 1) {
    s.qkv_u.resize(g.set_rows * g.dim);
    s.o_u.resize(g.set_rows * g.q_cols);
    scatter_heads(g, s.qkv_u.data(), qkv, g.q_cols, g.kv_cols);
    A = s.qkv_u.data();
    O = s.o_u.data();
  }
  s.lse.resize(g.set_rows * heads_u_);
  std::fill_n(O, g.set_rows * g.q_cols, 0.0f);
  std::fill_n(s.lse.data(), s.lse.size(), -std::numeric_limits<float>::infinity());
  out_tmp_.resize(g.c * g.q_cols);
  lse_tmp_.resize(g.c * heads_u_);
  const int64_t kv_floats = g.set_rows * 2 * g.kv_cols;
  kv_cur_.resize(kv_floats);
  pack_kv(g, kv_cur_.data(), A);
  if (opt_.mode == CpMode::allgather) {
    s.kv_all.resize(R_ * kv_floats);
    opt_.ring->all_gather(kv_cur_.data(), s.kv_all.data(), kv_floats)();
    pairs_forward(g, A, O, s.lse.data(), s.kv_all.data(), 0, R_, documents);
  } else {
    // At step t this rank holds ring position pos - t's K|V; the next one travels meanwhile.
    kv_next_.resize(kv_floats);
    for (int t = 0; t < R_; ++t) {
      CpComm::Wait arrived;
      if (t + 1 < R_) arrived = opt_.ring->ring_shift(kv_cur_.data(), kv_next_.data(), kv_floats);
      pairs_forward(g, A, O, s.lse.data(), kv_cur_.data(), (g.pos - t + R_) % R_, 1, documents);
      if (arrived) {
        arrived();
        std::swap(kv_cur_, kv_next_);
      }
    }
  }
  if (U_ > 1) gather_heads(g, o, O, g.q_cols, 0, false);
}

void ContextAttention::backward(Saved& s, float* d_qkv, const float* d_o, const float* qkv,
                                const float* o, int64_t B, int64_t T, const int32_t* documents) {
  const Geometry g = geometry(B, T);
  const float* A = U_ > 1 ? s.qkv_u.data() : qkv;
  const float* O = U_ > 1 ? s.o_u.data() : o;
  const float* dO = d_o;
  float* dA = d_qkv;
  if (U_ > 1) {
    d_o_u_.resize(g.set_rows * g.q_cols);
    scatter_heads(g, d_o_u_.data(), d_o, g.q_cols, 0);
    dO = d_o_u_.data();
    d_a_.resize(g.set_rows * g.dim);
    dA = d_a_.data();
  }
  std::fill_n(dA, g.set_rows * g.dim, 0.0f);
  const int64_t kv_floats = g.set_rows * 2 * g.kv_cols;
  dkv_cur_.resize(kv_floats);
  if (opt_.mode == CpMode::allgather) {
    dkv_next_.resize(R_ * kv_floats);
    std::fill_n(dkv_next_.data(), dkv_next_.size(), 0.0f);
    pairs_backward(g, A, dA, O, s.lse.data(), dO, s.kv_all.data(), dkv_next_.data(), 0, R_,
                   documents);
    opt_.ring->reduce_scatter(dkv_next_.data(), dkv_cur_.data(), kv_floats)();
  } else {
    // K|V travel the ring again, and behind them an accumulator of their gradients per owner:
    // at step t this rank computes its part for the K|V in hand while the accumulator for them
    // (from the rank before, which finished its part a step ago) and the next K|V arrive, then
    // adds its part and passes the accumulator on. After R steps each is back at its owner.
    kv_cur_.resize(kv_floats);
    kv_next_.resize(kv_floats);
    dkv_next_.resize(kv_floats);
    dkv_part_.resize(R_ > 1 ? kv_floats : 0);
    pack_kv(g, kv_cur_.data(), A);
    std::fill_n(dkv_cur_.data(), kv_floats, 0.0f);
    for (int t = 0; t < R_; ++t) {
      CpComm::Wait kv_arrived, acc_arrived;
      if (t + 1 < R_)
        kv_arrived = opt_.ring->ring_shift(kv_cur_.data(), kv_next_.data(), kv_floats);
      if (t > 0) {
        acc_arrived = opt_.ring->ring_shift(dkv_cur_.data(), dkv_next_.data(), kv_floats);
        std::fill_n(dkv_part_.data(), kv_floats, 0.0f);
      }
      float* part = t > 0 ? dkv_part_.data() : dkv_cur_.data();
      pairs_backward(g, A, dA, O, s.lse.data(), dO, kv_cur_.data(), part, (g.pos - t + R_) % R_,
                     1, documents);
      if (acc_arrived) {
        acc_arrived();
        float* acc = dkv_next_.data();
        for (int64_t i = 0; i < kv_floats; ++i) acc[i] += part[i];
        std::swap(dkv_cur_, dkv_next_);
      }
      if (kv_arrived) {
        kv_arrived();
        std::swap(kv_cur_, kv_next_);
      }
    }
    if (R_ > 1) {  // the last accumulator goes home
      opt_.ring->ring_shift(dkv_cur_.data(), dkv_next_.data(), kv_floats)();
      std::swap(dkv_cur_, dkv_next_);
    }
  }
  unpack_kv(g, dA, dkv_cur_.data());
  if (U_ > 1) gather_heads(g, d_qkv, dA, g.q_cols, g.kv_cols, !kv_split_);
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
