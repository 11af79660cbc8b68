#include "cleave/model/block.h"

#include <cmath>
#include <cstring>
#include <string>

#include "cleave/kernels/activation.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/attention_cached.h"
#include "cleave/model/tp_pairs.h"

namespace cleave {

namespace {

std::string prefix(int layer) { return "blocks." + std::to_string(layer); }

// GPT-2 scales the init of the projections that write into the residual stream by 1/sqrt(2L),
// so the stream's variance does not grow with depth.
float residual_std(const ModelConfig& c) { return c.init_std / std::sqrt(2.0f * c.n_layers); }

// The placements of the four linears on tp ranks (none at tp = 1: whole tensors). qkv's rows are
// the rank's q heads, then its k heads, then its v heads, from the three parts of the global
// [q | k | v]; SwiGLU's fused [gate | up] likewise in two parts.
Placement qkv_placement(const ModelConfig& c, const TpShare& s) {
  if (s.tp == 1) return {};
  const int64_t hd = c.head_dim(), q = int64_t(s.heads) * hd, kv = int64_t(s.kv_heads) * hd;
  const GradSum kv_sum = s.kv_replicated ? GradSum::kv_replicas : GradSum::none;
  const int64_t k0 = int64_t(c.n_heads) * hd, v0 = k0 + int64_t(c.n_kv_heads) * hd;
  return shard_rows({c.qkv_dim(), c.d_model},
                    {{0, s.rank * q, q, GradSum::none},
                     {q, k0 + s.first_kv_head * hd, kv, kv_sum},
                     {q + kv, v0 + s.first_kv_head * hd, kv, kv_sum}});
}

Placement fc_placement(const ModelConfig& c, const TpShare& s) {
  if (s.tp == 1) return {};
  const int64_t f = s.ffn;
  std::vector<Segment> segments = {{0, s.rank * f, f, GradSum::none}};
  if (c.family == Family::llama) segments.push_back({f, c.ffn_hidden + s.rank * f, f, GradSum::none});
  return shard_rows({c.mlp_in_dim(), c.d_model}, std::move(segments));
}

Placement row_parallel(const TpShare& s, int64_t out, int64_t in_global, int64_t in_local) {
  if (s.tp == 1) return {};
  return shard_cols({out, in_global}, s.rank * in_local, in_local);
}

}  // namespace

Block::Block(ParamStore& store, int layer, const ModelConfig& c, Precision p,
             const kernels::RopeTable* rope, const TensorParallelOptions& tp)
    : cfg_(c), rope_(rope), tp_(tp), share_(tp_share(c, tp.size(), tp.rank())),
      name_(prefix(layer)),
      norm1_(store, name_ + ".norm1", c.d_model, c.family == Family::gpt2, c.norm_eps,
             tp.sequence_parallel ? GradSum::tp : GradSum::none),
      norm2_(store, name_ + ".norm2", c.d_model, c.family == Family::gpt2, c.norm_eps,
             tp.sequence_parallel ? GradSum::tp : GradSum::none),
      qkv_(store, name_ + ".attn.qkv", c.d_model, share_.qkv_dim(c.head_dim()),
           c.family == Family::gpt2, c.init_std, p, qkv_placement(c, share_)),
      out_(store, name_ + ".attn.out", share_.heads * c.head_dim(), c.d_model,
           c.family == Family::gpt2, residual_std(c), p,
           row_parallel(share_, c.d_model, c.n_heads * c.head_dim(), share_.heads * c.head_dim())),
      fc_(store, name_ + ".mlp.fc", c.d_model,
          c.family == Family::llama ? 2 * share_.ffn : share_.ffn, c.family == Family::gpt2,
          c.init_std, p, fc_placement(c, share_)),
      proj_(store, name_ + ".mlp.proj", share_.ffn, c.d_model, c.family == Family::gpt2,
            residual_std(c), p, row_parallel(share_, c.d_model, c.ffn_hidden, share_.ffn)) {}

void Block::bind(ParamStore& store) {
  norm1_.bind(store);
  norm2_.bind(store);
  qkv_.bind(store);
  out_.bind(store);
  fc_.bind(store);
  proj_.bind(store);
}

void Block::reserve(Slot& s, int64_t B, int64_t T) {
  const int64_t N = B * T;
  if (N == s.B * s.T && B == s.B) return;
  const int64_t d = cfg_.d_model, n = local_rows(N), hd = cfg_.head_dim();
  s.h1.resize(n * d);
  s.qkv_act.resize(N * share_.qkv_dim(int(hd)));
  s.o.resize(N * share_.heads * hd);
  s.lse.resize(N * share_.heads);
  s.x_mid.resize(n * d);
  s.h2.resize(n * d);
  s.fc_act.resize(N * fc_.gemm().out_features());
  s.act.resize(N * share_.ffn);
  s.B = B, s.T = T;
}

// Sized once per slot: a resize returns the pages, and faulting them in again on every input half
// cost zb1p about 5% of its backward (perf: 2.4x the page faults of fused backwards).
void Block::reserve_deferred(Slot& s) {
  const int64_t N = s.B * s.T, d = cfg_.d_model;
  if (s.dy.size() == N * d) return;
  s.dy.resize(N * d);
  s.d_fc.resize(N * fc_.gemm().out_features());
  s.d_xmid.resize(N * d);
  s.d_qkv.resize(N * share_.qkv_dim(int(cfg_.head_dim())));
  s.d_h1.resize(N * d);
  s.d_h2.resize(N * d);
}

void Block::reserve_grads(BlockGrads& g, int64_t N) const {
  const int64_t d = cfg_.d_model, n = local_rows(N), hd = cfg_.head_dim();
  g.d_act.resize(N * share_.ffn);
  g.d_fc.resize(N * fc_.gemm().out_features());
  g.d_h2.resize(N * d);
  g.d_xmid.resize(n * d);
  g.d_o.resize(N * share_.heads * hd);
  g.d_qkv.resize(N * share_.qkv_dim(int(hd)));
  g.d_h1.resize(N * d);
  if (tp_.sequence_parallel) {
    g.dy_full.resize(N * d);
    g.d_xmid_full.resize(N * d);
    g.d_h2_full.resize(N * d);
    g.d_h1_full.resize(N * d);
    g.gathered.resize(N * d);
    g.partial.resize(N * d);
  }
}

void Block::forward(int slot, float* x_out, const float* x_in, int64_t B, int64_t T) {
  forward_impl(slots_.at(size_t(slot)), x_out, x_in, B, T, nullptr);
}

void Block::forward_cached(float* x_out, const float* x_in, int64_t T, KVCache& cache) {
  CLEAVE_CHECK(share_.tp == 1, "generation runs at tp = 1 (the model has tp " << share_.tp << ")");
  forward_impl(slots_.front(), x_out, x_in, 1, T, &cache);
}

const float* Block::enter_column(const float* local, float* full, int64_t N, const char* what) {
  if (!tp_.comm) return local;
  const int64_t d = cfg_.d_model;
  if (!tp_.sequence_parallel) {
    tp_pairs::copy_forward();
    if (tp_.check_placements)
      tp_.comm->check_replicated(local, N * d, name_ + "." + what + " input (Replicate on tp)");
    return local;
  }
  tp_pairs::gather_forward(*tp_.comm, local, full, local_rows(N) * d)();
  return full;
}

void Block::leave_row(float* partial, float* out, int64_t N) {
  if (!tp_.comm) return;
  const int64_t d = cfg_.d_model;
  if (tp_.sequence_parallel) tp_pairs::scatter_forward(*tp_.comm, partial, out, local_rows(N) * d)();
  else tp_pairs::reduce_forward(*tp_.comm, out, N * d)();
}

void Block::forward_impl(Slot& s, float* x_out, const float* x_in, int64_t B, int64_t T,
                         KVCache* cache) {
  reserve(s, B, T);
  const int64_t N = B * T, n = local_rows(N), d = cfg_.d_model, hd = cfg_.head_dim();
  const int heads = share_.heads, kv_heads = share_.kv_heads;
  const int64_t q_dim = int64_t(heads) * hd, kv_dim = int64_t(kv_heads) * hd;
  const int64_t qkv_dim = share_.qkv_dim(int(hd));
  const int64_t pos0 = cache ? cache->length : 0;
  const bool sp = tp_.sequence_parallel;
  CLEAVE_CHECK(!sp || shared_, name_ << ": sequence parallelism without shared scratch");
  float* gathered = sp ? shared_->gathered.data() : nullptr;
  float* partial = sp ? shared_->partial.data() : nullptr;
  s.x_in = x_in;

  norm1_.forward(s.h1.data(), x_in, n, s.norm1);
  const float* h1 = enter_column(s.h1.data(), gathered, N, "attn.qkv");
  qkv_.forward(s.qkv_act.data(), h1, N, sp ? nullptr : &s.qkv_x);
  if (rope_)  // q and k heads are adjacent at the start of each row: rotate them together
    kernels::rope_forward(s.qkv_act.data(), *rope_, B, T, heads + kv_heads, qkv_dim, pos0);
  if (cache) {
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(cache->k.data() + (pos0 + t) * kv_dim, s.qkv_act.data() + t * qkv_dim + q_dim,
                  kv_dim * sizeof(float));
      std::memcpy(cache->v.data() + (pos0 + t) * kv_dim,
                  s.qkv_act.data() + t * qkv_dim + q_dim + kv_dim, kv_dim * sizeof(float));
    }
    kernels::attention_cached(s.o.data(), s.qkv_act.data(), qkv_dim, cache->k.data(),
                              cache->v.data(), T, pos0, heads, kv_heads, int(hd));
    cache->length += T;
  } else {
    const kernels::AttentionShape shape{B, T, heads, kv_heads, int(hd), qkv_dim, qkv_dim};
    const float* q = s.qkv_act.data();
    kernels::attention_forward(s.o.data(), s.lse.data(), q, q + q_dim, q + q_dim + kv_dim, shape);
  }
  out_.forward(sp ? partial : s.x_mid.data(), s.o.data(), N, &s.out_x);
  leave_row(partial, s.x_mid.data(), N);
  out_.add_bias(s.x_mid.data(), n);
  kernels::add_inplace(s.x_mid.data(), x_in, n * d);

  norm2_.forward(s.h2.data(), s.x_mid.data(), n, s.norm2);
  const float* h2 = enter_column(s.h2.data(), gathered, N, "mlp.fc");
  fc_.forward(s.fc_act.data(), h2, N, sp ? nullptr : &s.fc_x);
  if (cfg_.family == Family::gpt2)
    kernels::gelu_forward(s.act.data(), s.fc_act.data(), N * share_.ffn);
  else
    kernels::swiglu_forward(s.act.data(), s.fc_act.data(), N, share_.ffn);
  proj_.forward(sp ? partial : x_out, s.act.data(), N, &s.proj_x);
  leave_row(partial, x_out, N);
  proj_.add_bias(x_out, n);
  kernels::add_inplace(x_out, s.x_mid.data(), n * d);
}

void start_gather_rows(TpComm& comm, BlockGrads& g, const float* local, int64_t n) {
  g.dy_gathered = tp_pairs::scatter_backward(comm, local, g.dy_full.data(), n);
  g.dy_source = local;
}

const float* gathered_rows(TpComm& comm, BlockGrads& g, const float* local, int64_t n) {
  if (g.dy_source != local) start_gather_rows(comm, g, local, n);
  g.dy_gathered();
  g.dy_source = nullptr;
  return g.dy_full.data();
}

void Block::backward(int slot, float* dx_in, const float* dx_out, BlockGrads& g,
                     BackwardPart part) {
  Slot& s = slots_.at(size_t(slot));
  if (part == BackwardPart::weight) return weight_gradients(s, g);
  const bool defer = part == BackwardPart::input;  // the weight gradients come later
  const int64_t B = s.B, T = s.T, N = B * T, n = local_rows(N), d = cfg_.d_model;
  const int64_t hd = cfg_.head_dim();
  const int heads = share_.heads, kv_heads = share_.kv_heads;
  const int64_t q_dim = int64_t(heads) * hd, kv_dim = int64_t(kv_heads) * hd;
  const int64_t qkv_dim = share_.qkv_dim(int(hd));
  const bool sp = tp_.sequence_parallel;
  TpComm* comm = tp_.comm;
  if (defer) reserve_deferred(s);
  // A column-parallel input's gradient is a partial sum over tp: start reducing it into `local`.
  auto start_column_reduce = [&](float* full, float* local) -> TpComm::Wait {
    if (!comm) return [] {};
    return sp ? tp_pairs::gather_backward(*comm, full, local, n * d)
              : tp_pairs::copy_backward(*comm, local, N * d);
  };
  // Under sequence parallelism the column-parallel inputs are gathered again for the weight
  // gradients, each started ahead of the products before it.
  auto regather = [&](const float* local) -> TpComm::Wait {
    if (!sp || defer) return [] {};
    return tp_pairs::gather_forward(*comm, local, g.gathered.data(), n * d);
  };
  const float* h1 = sp ? g.gathered.data() : s.h1.data();
  const float* h2 = sp ? g.gathered.data() : s.h2.data();
  float* d_fc = defer ? s.d_fc.data() : g.d_fc.data();
  float* d_qkv = defer ? s.d_qkv.data() : g.d_qkv.data();
  float* d_h2 = defer ? s.d_h2.data() : g.d_h2.data();
  float* d_h1 = defer ? s.d_h1.data() : g.d_h1.data();
  float* d_h2_full = sp ? g.d_h2_full.data() : d_h2;
  float* d_h1_full = sp ? g.d_h1_full.data() : d_h1;
  // The gradient of a row-parallel output enters every row: without sequence parallelism it is
  // replicated already; with it, an all-gather (the conjugate of forward's reduce-scatter). The
  // weight gradients hide the collectives: both of a half-block's under its all-reduce without
  // sequence parallelism; with it, the row-parallel one under the reduce-scatter and the
  // column-parallel one under the all-gather that follows.
  TpComm::Wait h2_ready = regather(s.h2.data());
  const float* dy = dx_out;
  if (sp) dy = gathered_rows(*comm, g, dx_out, n * d);
  else tp_pairs::reduce_backward();
  // The output gradients' bf16 copies serve the weight gradients of a whole backward only.
  auto keep = [&](OperandCopy& c) { return defer ? nullptr : &c; };
  const OperandCopy* qkv_x = sp ? nullptr : &s.qkv_x;
  const OperandCopy* fc_x = sp ? nullptr : &s.fc_x;
  proj_.backward_input(g.d_act.data(), dy, N, false, keep(g.proj_dy));
  if (cfg_.family == Family::gpt2)
    kernels::gelu_backward(d_fc, g.d_act.data(), s.fc_act.data(), N * share_.ffn);
  else
    kernels::swiglu_backward(d_fc, g.d_act.data(), s.fc_act.data(), N, share_.ffn);
  fc_.backward_input(d_h2_full, d_fc, N, false, keep(g.fc_dy));
  TpComm::Wait reduced = start_column_reduce(d_h2_full, d_h2);
  if (defer) {
    std::memcpy(s.dy.data(), dy, N * d * sizeof(float));
  } else {
    proj_.backward_weight(dy, s.act.data(), N, &g.proj_dy, &s.proj_x);
    if (!sp) fc_.backward_weight(d_fc, h2, N, &g.fc_dy, fc_x);
  }
  reduced();
  std::memcpy(g.d_xmid.data(), dx_out, n * d * sizeof(float));
  norm2_.backward_input(g.d_xmid.data(), d_h2, s.x_mid.data(), n, s.norm2);
  const float* d_xmid = g.d_xmid.data();
  TpComm::Wait d_xmid_ready = [] {};
  if (sp) {
    d_xmid_ready = tp_pairs::scatter_backward(*comm, d_xmid, g.d_xmid_full.data(), n * d);
    d_xmid = g.d_xmid_full.data();
    if (!defer) {
      h2_ready();
      fc_.backward_weight(d_fc, h2, N, &g.fc_dy, fc_x);
    }
  }
  if (!defer) norm2_.backward_weight(d_h2, s.x_mid.data(), n, s.norm2);
  d_xmid_ready();

  TpComm::Wait h1_ready = regather(s.h1.data());
  out_.backward_input(g.d_o.data(), d_xmid, N, false, keep(g.out_dy));
  const kernels::AttentionShape shape{B, T, heads, kv_heads, int(hd), qkv_dim, qkv_dim};
  const float* q = s.qkv_act.data();
  kernels::attention_backward(d_qkv, d_qkv + q_dim, d_qkv + q_dim + kv_dim, g.d_o.data(), q,
                              q + q_dim, q + q_dim + kv_dim, s.o.data(), s.lse.data(), shape);
  if (rope_) kernels::rope_backward(d_qkv, *rope_, B, T, heads + kv_heads, qkv_dim, 0);
  qkv_.backward_input(d_h1_full, d_qkv, N, false, keep(g.qkv_dy));
  reduced = start_column_reduce(d_h1_full, d_h1);
  if (defer) {
    std::memcpy(s.d_xmid.data(), d_xmid, N * d * sizeof(float));
  } else {
    out_.backward_weight(d_xmid, s.o.data(), N, &g.out_dy, &s.out_x);
    if (!sp) qkv_.backward_weight(d_qkv, h1, N, &g.qkv_dy, qkv_x);
  }
  reduced();
  std::memcpy(dx_in, g.d_xmid.data(), n * d * sizeof(float));
  norm1_.backward_input(dx_in, d_h1, s.x_in, n, s.norm1);
  if (sp) {
    // The next block's gradient rows, gathered under this block's last weight gradients.
    start_gather_rows(*comm, g, dx_in, n * d);
    if (!defer) {
      h1_ready();
      qkv_.backward_weight(d_qkv, h1, N, &g.qkv_dy, qkv_x);
    }
  }
  if (!defer) norm1_.backward_weight(d_h1, s.x_in, n, s.norm1);
}

void Block::weight_gradients(Slot& s, BlockGrads& g) {
  const int64_t N = s.B * s.T, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  // Under sequence parallelism the column-parallel inputs are gathered again, as in backward.
  auto input_of = [&](const Buffer<float>& local) -> const float* {
    if (!sp) return local.data();
    tp_pairs::gather_forward(*tp_.comm, local.data(), g.gathered.data(), n * d)();
    return g.gathered.data();
  };
  proj_.backward_weight(s.dy.data(), s.act.data(), N, nullptr, &s.proj_x);
  fc_.backward_weight(s.d_fc.data(), input_of(s.h2), N, nullptr, sp ? nullptr : &s.fc_x);
  norm2_.backward_weight(s.d_h2.data(), s.x_mid.data(), n, s.norm2);
  out_.backward_weight(s.d_xmid.data(), s.o.data(), N, nullptr, &s.out_x);
  qkv_.backward_weight(s.d_qkv.data(), input_of(s.h1), N, nullptr, sp ? nullptr : &s.qkv_x);
  norm1_.backward_weight(s.d_h1.data(), s.x_in, n, s.norm1);
}

}  // namespace cleave
