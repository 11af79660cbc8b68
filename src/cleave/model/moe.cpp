#include "cleave/model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cleave/kernels/linear.h"
#include "cleave/kernels/moe_router.h"

namespace cleave {

namespace {

// rows of `from` [.., d] in blocks of counts[i] rows, block i taken in the order `order`.
void reorder_blocks(float* to, const float* from, const std::vector<int64_t>& counts,
                    const std::vector<int>& order, int64_t d) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) at[i + 1] = at[i] + counts[i];
  int64_t out = 0;
  for (int i : order) {
    std::memcpy(to + out * d, from + at[size_t(i)] * d, size_t(counts[size_t(i)] * d) * sizeof(float));
    out += counts[size_t(i)];
  }
}

}  // namespace

void Moe::Saved::release() {
  for (Buffer<float>* b : {&logits, &gate, &fraction, &y_send, &x_expert, &d_logits, &pool_fc,
                           &pool_act, &pool_dy, &pool_dfc})
    *b = Buffer<float>();
  pool_x_copy = Buffer<bf16>();
  pool_act_copy = Buffer<bf16>();
  choice.clear();
  row.clear();
  routes = Routes();
  for (Mlp::Saved& e : experts) e.release();
  shared.release();
  N = B = T = 0;
}

Moe::Moe(ParamStore& store, const std::string& name, int layer, const ModelConfig& c,
         const TpShare& share, Precision precision, const TensorParallelOptions& tp,
         const MoeOptions& options)
    : cfg_(c), layer_(layer), E_(c.moe_experts), k_(c.moe_top_k), precision_(precision), tp_(tp),
      opt_(options),
      router_(store, name + ".router", c.d_model, c.moe_experts, false, c.init_std,
              Precision::fp32) {
  CLEAVE_CHECK(E_ % opt_.ep_size() == 0, "model.moe_experts = " << E_ << " cannot be split over "
                                             "parallel.ep = " << opt_.ep_size());
  const int first = opt_.ep_rank() * local_experts();
  for (int e = 0; e < local_experts(); ++e) {
    experts_.push_back(std::make_unique<Mlp>(store, name + ".experts." + std::to_string(first + e),
                                             c, share, precision, c.moe_ffn_hidden,
                                             opt_.expert_group));
    experts_.back()->set_variable_rows();
  }
  if (c.moe_shared_experts > 0)
    shared_ = std::make_unique<Mlp>(store, name + ".shared", c, share, precision,
                                    c.moe_shared_experts * c.moe_ffn_hidden);
  if (c.moe_router == MoeRouter::sigmoid_bias) bias_.assign(size_t(E_), 0.0f);
  stats_.layer = layer;
  stats_.tokens.assign(size_t(E_), 0.0);
  stats_.kept.assign(size_t(E_), 0.0);
}

void Moe::bind(ParamStore& store) {
  router_.bind(store);
  for (auto& e : experts_) e->bind(store);
  if (shared_) shared_->bind(store);
}

void Moe::reserve(Scratch& g, int64_t N) const {
  // An expert takes each of a rank's tokens at most once: N rows at most, and under expert
  // parallelism up to N from each ep rank (grown in backward when a step needs it).
  if (!experts_.empty() && g.expert_rows < N) {
    experts_.front()->reserve(g.expert, N);
    g.expert_rows = N;
  }
  if (shared_) shared_->reserve(g.shared, N);
  g.probs.grow(N * E_);
  g.d_probs.grow(N * E_);
  g.d_logits.grow(N * E_);
  g.d_gate.grow(N * k_);
}

void Moe::add_bias(float* y, int64_t rows) const {
  if (shared_) shared_->add_bias(y, rows);
}

void Moe::count_choices(const Saved& s, Scratch& g) const {
  // Each rank holds H chunks of each sequence (2 under context parallelism, dealt zigzag; else
  // the whole sequence as one): the choices of each (sequence, choice rank, chunk, expert),
  // gathered over the cp ranks into the global chunks' order.
  const int E = E_, k = k_, cp = opt_.cp_size(), H = chunks_per_rank(), G = cp * H;
  const int64_t B = s.B, c = s.T / H;
  const int64_t mine = B * k * H * E;
  g.gathered_counts.grow(mine * (cp + 1));
  float* local = g.gathered_counts.data() + mine * cp;
  std::fill(local, local + mine, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int64_t t = b * s.T + h * c; t < b * s.T + (h + 1) * c; ++t)
        for (int j = 0; j < k; ++j)
          local[((b * k + j) * H + h) * E + s.choice[size_t(t * k + j)]] += 1;
  const float* all = local;
  if (cp > 1) {
    opt_.sequence->all_gather(local, g.gathered_counts.data(), mine)();
    all = g.gathered_counts.data();
  }
  g.chunk_counts.assign(size_t(B * k * G * E), 0);
  for (int r = 0; r < cp; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int j = 0; j < k; ++j)
        for (int h = 0; h < H; ++h) {
          const int q = cp > 1 ? int(zigzag_chunk(cp, r, h)) : 0;
          const float* from = all + r * mine + ((b * k + j) * H + h) * E;
          for (int e = 0; e < E; ++e)
            g.chunk_counts[size_t(((b * k + j) * G + q) * E + e)] = from[e];
        }
}

double Moe::assign_rows(Saved& s, const Scratch& g, bool dropless) const {
  const int64_t N = s.N;
  const int E = E_, k = k_, cp = opt_.cp_size(), H = chunks_per_rank(), G = cp * H;
  const int64_t c = s.T / H;
  s.row.assign(size_t(N * k), 0);
  std::vector<int64_t>& send_rows = s.routes.send_rows;
  send_rows.assign(size_t(E), 0);
  const double factor = cfg_.moe_capacity_factor;
  const int64_t capacity = factor > 0 && !dropless ? int64_t(std::ceil(factor * double(s.T * cp) * k / E))
                                      : std::numeric_limits<int64_t>::max();
  // A choice's place in its sequence's priority order: every choice of a lower rank, then those
  // of its rank in earlier chunks, then those earlier in its chunk. It is kept within capacity.
  std::vector<int64_t> place(static_cast<size_t>(E));
  double dropped = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int j = 0; j < k; ++j)
      for (int h = 0; h < H; ++h) {
        const int q = cp > 1 ? int(zigzag_chunk(cp, opt_.cp_rank(), h)) : 0;
        for (int e = 0; e < E; ++e) {
          int64_t before = 0;
          for (int jj = 0; jj <= j; ++jj)
            for (int qq = 0; qq < (jj < j ? G : q); ++qq)
              before += int64_t(g.chunk_counts[size_t(((b * k + jj) * G + qq) * E + e)]);
          place[size_t(e)] = before;
        }
        for (int64_t t = b * s.T + h * c; t < b * s.T + (h + 1) * c; ++t) {
          const int32_t e = s.choice[size_t(t * k + j)];
          if (place[size_t(e)]++ >= capacity) {
            s.row[size_t(t * k + j)] = -1;
            ++dropped;
          }
        }
      }
  for (int64_t i = 0; i < N * k; ++i)
    if (s.row[size_t(i)] >= 0) ++send_rows[size_t(s.choice[size_t(i)])];
  // Send order: by expert, and within an expert by token.
  std::vector<int64_t> next(size_t(E), 0);
  for (int e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e - 1)] + send_rows[size_t(e - 1)];
  for (int64_t i = 0; i < N * k; ++i)
    if (s.row[size_t(i)] >= 0) s.row[size_t(i)] = next[size_t(s.choice[size_t(i)])]++;
  return dropped;
}

void Moe::forward(Saved& s, Scratch& g, float* y, const float* x, const Batch& batch,
                  bool keep_x, float grad_scale, bool count, bool dropless) {
  const int64_t B = batch.B, T = batch.T, N = B * T, d = cfg_.d_model;
  const int E = E_, k = k_;
  s.N = N, s.B = B, s.T = T;
  s.grad_scale = grad_scale;
  s.x_kept = keep_x;
  s.logits.grow(N * E);
  s.gate.grow(N * k);
  s.fraction.grow(B * E);
  s.choice.resize(size_t(N * k));
  g.probs.grow(N * E);
  router_.forward(s.logits.data(), x, N);
  kernels::route_forward(cfg_.moe_router, s.logits.data(), bias_.empty() ? nullptr : bias_.data(),
                         N, E, k, s.choice.data(), s.gate.data(), g.probs.data());
  // Each sequence's routed fractions f (before capacity) and, for the statistics, the auxiliary
  // loss coef x E x sum f P, P the mean probabilities (each rank adds its tokens' part of them).
  count_choices(s, g);
  const int G = opt_.cp_size() * chunks_per_rank();
  const int64_t T_seq = T * opt_.cp_size();
  const double coef = cfg_.moe_aux_loss_coef;
  for (int64_t b = 0; b < B; ++b) {
    float* f = s.fraction.data() + b * E;
    std::fill(f, f + E, 0.0f);
    for (int j = 0; j < k; ++j)
      for (int q = 0; q < G; ++q)
        for (int e = 0; e < E; ++e) f[e] += g.chunk_counts[size_t(((b * k + j) * G + q) * E + e)];
    for (int e = 0; e < E; ++e) f[e] /= float(T_seq * k);
    if (count && coef > 0) {
      double aux = 0;
      for (int e = 0; e < E; ++e) {
        double P = 0;
        for (int64_t t = b * T; t < (b + 1) * T; ++t) P += g.probs[t * E + e];
        aux += double(f[e]) * P / double(T_seq);
      }
      stats_.aux += coef * E * aux;
    }
  }
  if (count)
    for (int64_t i = 0; i < N * k; ++i) stats_.tokens[size_t(s.choice[size_t(i)])] += 1;
  if (count && cfg_.moe_z_loss_coef > 0)
    stats_.z += cfg_.moe_z_loss_coef * kernels::router_z_loss(s.logits.data(), N, E, 0, nullptr);
  const double dropped = assign_rows(s, g, dropless);
  if (count) {
    stats_.dropped += dropped;
    for (int e = 0; e < E; ++e) stats_.kept[size_t(e)] += double(s.routes.send_rows[size_t(e)]);
  }

  dispatch(s, g, x);
  // The shared experts run while the routed rows travel.
  if (shared_) shared_->forward(s.shared, y, x, N, keep_x);
  else std::memset(y, 0, size_t(N * d) * sizeof(float));
  run_experts(s, g, dropless);
  combine(s, y);
}

// Measured with oneDNN's runtime row count on AVX-512 (Zen 5): a row's fp32 bits take one value at
// 1 row, another at 2-15 and a third at 16 or more; bf16's at 1 and at 2 or more. Whole tiles of
// 16 keep every call in one class, and are the tiles LinearGemm's row-invariant products run in
// where they must (AVX2): one constant for both.
constexpr int64_t kInferenceRowTile = kInvariantRowTile;

void Moe::dispatch(Saved& s, Scratch& g, const float* x) {
  const int64_t d = cfg_.d_model, N = s.N;
  const int k = k_;
  Saved::Routes& r = s.routes;
  r.sent = 0;
  for (int64_t n : r.send_rows) r.sent += n;
  const bool ep = opt_.ep != nullptr;
  float* rows = nullptr;
  if (ep) {
    g.x_send.grow(r.sent * d);
    rows = g.x_send.data();
  } else {
    s.x_expert.grow(r.sent * d);
    rows = s.x_expert.data();
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t row = s.row[size_t(t * k + j)];
      if (row >= 0) std::memcpy(rows + row * d, x + t * d, size_t(d) * sizeof(float));
    }
  if (!ep) {
    r.recv_rows = r.send_rows;
    plan_routes(r);
    return;
  }
  // How many rows each source sends each of this rank's experts, then the rows, received by
  // source and regrouped by expert.
  const int L = local_experts();
  g.counts.grow(2 * int64_t(E_));
  for (int e = 0; e < E_; ++e) g.counts[e] = float(r.send_rows[size_t(e)]);
  opt_.ep->all_to_all(g.counts.data(), g.counts.data() + E_, L)();
  r.recv_rows.resize(size_t(E_));
  for (int e = 0; e < E_; ++e) r.recv_rows[size_t(e)] = int64_t(g.counts[E_ + e]);
  plan_routes(r);
  g.y_expert.grow(r.received * d);
  opt_.ep->all_to_allv(rows, r.to_owners, g.y_expert.data(), r.from_sources)();
  s.x_expert.grow(r.received * d);
  reorder_blocks(s.x_expert.data(), g.y_expert.data(), r.recv_rows, r.by_expert, d);
}

void Moe::plan_routes(Saved::Routes& r) const {
  const int64_t d = cfg_.d_model;
  const int L = local_experts(), P = opt_.ep_size();
  r.begin.assign(size_t(L) + 1, 0);
  for (int e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int src = 0; src < P; ++src) n += r.recv_rows[size_t(src * L + e)];
    r.begin[size_t(e) + 1] = r.begin[size_t(e)] + n;
  }
  r.received = r.begin.back();
  if (P == 1) return;
  r.to_owners.assign(size_t(P), 0);
  r.from_sources.assign(size_t(P), 0);
  for (int e = 0; e < E_; ++e) r.to_owners[size_t(e / L)] += r.send_rows[size_t(e)] * d;
  for (int src = 0; src < P; ++src)
    for (int e = 0; e < L; ++e) r.from_sources[size_t(src)] += r.recv_rows[size_t(src * L + e)] * d;
  r.by_expert.clear();
  r.by_expert_rows.clear();
  r.by_source.assign(size_t(P * L), 0);
  for (int e = 0; e < L; ++e)
    for (int src = 0; src < P; ++src) {
      r.by_expert.push_back(src * L + e);
      r.by_expert_rows.push_back(r.recv_rows[size_t(src * L + e)]);
      r.by_source[size_t(src * L + e)] = e * P + src;
    }
}

void Moe::run_experts(Saved& s, Scratch& g, bool dropless) {
  const int64_t d = cfg_.d_model;
  const Saved::Routes& r = s.routes;
  const bool ep = opt_.ep != nullptr;
  s.y_send.grow(r.sent * d);
  float* out = ep ? g.y_expert.grow(r.received * d) : s.y_send.data();
  s.experts.resize(size_t(local_experts()));
  lend(s, true, false);
  for (int e = 0; e < local_experts(); ++e) {
    const int64_t at = r.begin[size_t(e)], n = r.begin[size_t(e) + 1] - at;
    if (n == 0) continue;
    const int64_t tiles = (n + kInferenceRowTile - 1) / kInferenceRowTile * kInferenceRowTile;
    if (dropless && tiles != n) {
      float* in = g.tile_in.grow(tiles * d);
      std::memcpy(in, s.x_expert.data() + at * d, size_t(n * d) * sizeof(float));
      std::memset(in + n * d, 0, size_t((tiles - n) * d) * sizeof(float));
      experts_[size_t(e)]->forward(s.experts[size_t(e)], g.tile_out.grow(tiles * d), in, tiles, true);
      std::memcpy(out + at * d, g.tile_out.data(), size_t(n * d) * sizeof(float));
    } else {
      experts_[size_t(e)]->forward(s.experts[size_t(e)], out + at * d, s.x_expert.data() + at * d,
                                   n, true);
    }
    if (tp_.rank() == 0) experts_[size_t(e)]->add_bias(out + at * d, n);
  }
  if (!ep) return;
  // Back to the sources: regrouped by source, then all-to-all(v) into send order.
  g.x_send.grow(r.received * d);
  reorder_blocks(g.x_send.data(), out, r.by_expert_rows, r.by_source, d);
  opt_.ep->all_to_allv(g.x_send.data(), r.from_sources, s.y_send.data(), r.to_owners)();
}

void Moe::combine(Saved& s, float* y) const {
  const int64_t d = cfg_.d_model;
  const int k = k_;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < s.N; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t r = s.row[size_t(t * k + j)];
      if (r < 0) continue;
      const float g = s.gate[t * k + j];
      const float* src = s.y_send.data() + r * d;
      float* dst = y + t * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += g * src[c];
    }
}

void Moe::backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer) {
  const int64_t N = s.N, d = cfg_.d_model;
  const int E = E_, k = k_, L = local_experts();
  const bool ep = opt_.ep != nullptr;
  const Saved::Routes& r = s.routes;
  const int64_t sent = r.sent, received = r.received;
  // The gates' gradients (a partial sum over tp, as the expert outputs are) and the rows'.
  g.d_gate.grow(N * k);
  g.dy_send.grow(sent * d);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t row = s.row[size_t(t * k + j)];
      float dot = 0;
      if (row >= 0) {
        const float* out = s.y_send.data() + row * d;
        const float* g_row = dy + t * d;
        const float gate = s.gate[t * k + j];
        float* dst = g.dy_send.data() + row * d;
        for (int64_t c = 0; c < d; ++c) dot += g_row[c] * out[c], dst[c] = gate * g_row[c];
      }
      g.d_gate[t * k + j] = dot;
    }
  TpComm::Wait gates_reduced = [] {};
  if (tp_.comm) gates_reduced = tp_.comm->all_reduce(g.d_gate.data(), N * k);

  const float* dy_expert = g.dy_send.data();
  EpComm::Wait arrived = [] {};
  if (ep) {
    g.dx_expert.grow(received * d);
    arrived = opt_.ep->all_to_allv(g.dy_send.data(), r.to_owners, g.dx_expert.data(), r.from_sources);
  }
  // The shared experts run while the rows' gradients travel.
  if (shared_) {
    shared_->backward_input(s.shared, g.shared, dx, dy, defer);
  } else {
    std::memset(dx, 0, size_t(N * d) * sizeof(float));
  }
  if (ep) {
    arrived();
    g.dy_expert.grow(received * d);
    reorder_blocks(g.dy_expert.data(), g.dx_expert.data(), r.recv_rows, r.by_expert, d);
    dy_expert = g.dy_expert.data();
  }
  g.dx_expert.grow(received * d);
  if (defer) lend(s, false, true);
  int64_t most = 0;
  for (int e = 0; e < L; ++e) most = std::max(most, r.begin[size_t(e) + 1] - r.begin[size_t(e)]);
  if (most > g.expert_rows) {
    experts_.front()->reserve(g.expert, most);
    g.expert_rows = most;
  }
  for (int e = 0; e < L; ++e) {
    const int64_t at = r.begin[size_t(e)];
    if (r.begin[size_t(e) + 1] == at) continue;
    Mlp& expert = *experts_[size_t(e)];
    Mlp::Saved& es = s.experts[size_t(e)];
    expert.backward_input(es, g.expert, g.dx_expert.data() + at * d, dy_expert + at * d, defer);
    // The scratch serves the next expert: a whole backward takes the weight gradients now.
    if (!defer) expert.backward_weight(es, s.x_expert.data() + at * d);
  }
  const float* dx_rows = g.dx_expert.data();
  if (ep) {
    g.dy_expert.grow(received * d);
    reorder_blocks(g.dy_expert.data(), g.dx_expert.data(), r.by_expert_rows, r.by_source, d);
    g.dx_send.grow(sent * d);
    arrived = opt_.ep->all_to_allv(g.dy_expert.data(), r.from_sources, g.dx_send.data(), r.to_owners);
    dx_rows = g.dx_send.data();
  }

  // The router, while the rows' input gradients travel back.
  gates_reduced();
  const float* d_probs = nullptr;
  if (cfg_.moe_aux_loss_coef > 0) {
    // d(coef E sum_e f_e P_e) / d p[t, e] = coef E f_e / T per sequence; the mean over the
    // step's sequences is grad_scale x T times the sum.
    const float scale = s.grad_scale * cfg_.moe_aux_loss_coef * float(E);
    g.d_probs.grow(N * E);
    for (int64_t t = 0; t < N; ++t)
      for (int e = 0; e < E; ++e)
        g.d_probs[t * E + e] = scale * s.fraction[(t / s.T) * E + e];
    d_probs = g.d_probs.data();
  }
  float* d_logits = defer ? s.d_logits.grow(N * E) : g.d_logits.grow(N * E);
  kernels::route_backward(cfg_.moe_router, s.logits.data(), s.choice.data(), s.gate.data(),
                          g.d_gate.data(), d_probs, N, E, k, d_logits);
  if (cfg_.moe_z_loss_coef > 0)
    kernels::router_z_loss(s.logits.data(), N, E, s.grad_scale * cfg_.moe_z_loss_coef, d_logits);
  arrived();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t row = s.row[size_t(t * k + j)];
      if (row < 0) continue;
      const float* src = dx_rows + row * d;
      float* dst = dx + t * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
    }
  // Every tp rank computed the same router gradient: one of them adds it to the partial sums.
  if (tp_.rank() == 0) router_.backward_input(dx, d_logits, N, true);
  s.d_logits_used = d_logits;
  s.experts_pending = defer;
}

void Moe::backward_weight(Saved& s, const float* x) {
  if (s.experts_pending) {
    const int64_t d = cfg_.d_model;
    const std::vector<int64_t>& begin = s.routes.begin;
    for (int e = 0; e < local_experts(); ++e)
      if (begin[size_t(e) + 1] > begin[size_t(e)])
        experts_[size_t(e)]->backward_weight(s.experts[size_t(e)],
                                             s.x_expert.data() + begin[size_t(e)] * d);
    s.experts_pending = false;
  }
  if (shared_) shared_->backward_weight(s.shared, x);
  router_.backward_weight(s.d_logits_used, x, s.N);
}

void Moe::release_activation(Saved& s, RecomputeSpares& spares) const {
  // The experts' views go, and the pools they view with them (their sizes change every step:
  // spares of their size would pile up).
  RecomputeSpares views;
  for (int e = 0; e < int(s.experts.size()); ++e)
    experts_[size_t(e)]->release_activation(s.experts[size_t(e)], views);
  s.pool_act = Buffer<float>();
  s.pool_x_copy = Buffer<bf16>();
  s.pool_act_copy = Buffer<bf16>();
  if (shared_) shared_->release_activation(s.shared, spares);
}

void Moe::lend(Saved& s, bool activations, bool deferred) const {
  const int64_t d = cfg_.d_model, rows = s.routes.received;
  const Mlp& first = *experts_.front();
  const int64_t fc = first.fc_width(), act = first.act_width();
  auto pool = [&](auto& buffer, int64_t width) { buffer.grow(rows * width); };
  if (activations) {
    pool(s.pool_fc, fc);
    if (first.act_in_fp32()) pool(s.pool_act, act);
    if (precision_ == Precision::bf16) {
      pool(s.pool_x_copy, d);
      pool(s.pool_act_copy, act);
    }
  }
  if (deferred) {
    pool(s.pool_dy, d);
    pool(s.pool_dfc, fc);
  }
  for (int e = 0; e < local_experts(); ++e) {
    const int64_t at = s.routes.begin[size_t(e)], n = s.routes.begin[size_t(e) + 1] - at;
    Mlp::Saved& es = s.experts[size_t(e)];
    if (activations) {
      es.fc.borrow(s.pool_fc.data() + at * fc, n * fc);
      if (first.act_in_fp32()) es.act.borrow(s.pool_act.data() + at * act, n * act);
      if (precision_ == Precision::bf16) {
        es.x_copy.data.borrow(s.pool_x_copy.data() + at * d, n * d);
        es.act_copy.data.borrow(s.pool_act_copy.data() + at * act, n * act);
      }
    }
    if (deferred) {
      es.dy.borrow(s.pool_dy.data() + at * d, n * d);
      es.d_fc.borrow(s.pool_dfc.data() + at * fc, n * fc);
    }
  }
}

void Moe::take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const {
  // The experts' rows vary per step: only the shared experts' buffers have a fixed size.
  if (shared_) shared_->take_spares(s.shared, spares, N);
}

void Moe::give_all(Saved& s, RecomputeSpares& spares) const {
  if (shared_) shared_->give_all(s.shared, spares);
  s.release();  // the experts' buffers with the rest: their sizes change every step
}

SavedBytes Moe::saved_bytes(int64_t N, bool keep_x) const {
  const int64_t d = cfg_.d_model;
  const int64_t sent = int64_t(double(N * k_) * planned_.sent + 0.5);
  const int64_t routed = int64_t(double(N * k_) * planned_.received + 0.5);
  const Mlp& first = *experts_.front();
  const int64_t fc = first.fc_width(), act = first.act_width();
  const int64_t copy = precision_ == Precision::bf16 ? int64_t(sizeof(bf16)) : 0;
  SavedBytes b = shared_ ? shared_->saved_bytes(N, keep_x) : SavedBytes{};
  // Router logits and gates; each choice's expert id (int32) and row (int64); the rows sent and
  // received and the experts' outputs of their fc.
  b.kept += (N * E_ + N * k_ + sent * d + routed * (d + fc)) * kFloatBytes +
            N * k_ * int64_t(sizeof(int32_t) + sizeof(int64_t));
  b.recomputable +=
      routed * ((first.act_in_fp32() ? act * kFloatBytes : 0) + (d + act) * copy);
  b.deferred += (routed * (d + fc) + N * E_) * kFloatBytes;  // dy, d_fc, the router's d_logits
  return b;
}

int64_t Moe::ep_scratch_bytes(int64_t N) const {
  // x_send carries the rows sent, then the outputs back: the larger of the two.
  const double rows = double(N * k_) * (std::max(planned_.sent, planned_.received) +
                                        2 * planned_.received + planned_.sent);
  return int64_t(rows + 0.5) * cfg_.d_model * kFloatBytes;
}

void Moe::recompute_activation(Saved& s, const float* x) {
  const int64_t d = cfg_.d_model;
  lend(s, true, false);
  const std::vector<int64_t>& begin = s.routes.begin;
  for (int e = 0; e < int(s.experts.size()); ++e)
    if (begin[size_t(e) + 1] > begin[size_t(e)])
      experts_[size_t(e)]->recompute_activation(s.experts[size_t(e)],
                                                s.x_expert.data() + begin[size_t(e)] * d);
  if (shared_) shared_->recompute_activation(s.shared, x);
}

MoeLayerStats Moe::take_stats() {
  MoeLayerStats out = stats_;
  out.bias = bias_;
  std::fill(stats_.tokens.begin(), stats_.tokens.end(), 0.0);
  std::fill(stats_.kept.begin(), stats_.kept.end(), 0.0);
  stats_.dropped = stats_.aux = stats_.z = 0;
  return out;
}

void Moe::update_bias(const std::vector<double>& load) {
  if (bias_.empty()) return;
  double mean = 0;
  for (double l : load) mean += l;
  mean /= double(E_);
  const float rate = cfg_.moe_bias_update_rate;
  // DeepSeek-V3: an overloaded expert's bias goes down by the rate, an underloaded one's up.
  float sum = 0;
  for (int e = 0; e < E_; ++e) {
    const double l = load[size_t(e)];
    bias_[size_t(e)] += l > mean ? -rate : l < mean ? rate : 0.0f;
    sum += bias_[size_t(e)];
  }
  const float shift = sum / float(E_);
  for (float& b : bias_) b -= shift;
}

}  // namespace cleave
