#include "cleave/model/block.h"

#include <cstring>
#include <string>

#include "cleave/kernels/activation.h"
#include "cleave/model/tp_pairs.h"

namespace cleave {

void Block::Saved::release() {
  for (Buffer<float>* b : {&h1, &x_mid, &h2, &d_h1, &d_h2}) *b = Buffer<float>();
  norm1 = NormStats();
  norm2 = NormStats();
  attn.release();
  if (ffn) ffn->release();
  B = T = 0;
}

Block::Block(ParamStore& store, int layer, const ModelConfig& c, Precision p,
             const kernels::RopeTable* rope, RecomputeSpares& spares,
             const TensorParallelOptions& tp, const ContextParallelOptions& cp,
             const MoeOptions& moe)
    : cfg_(c), tp_(tp), share_(tp_share(c, tp.size(), tp.rank())),
      name_("blocks." + std::to_string(layer)), spares_(spares),
      norm1_(store, name_ + ".norm1", c.d_model, c.family == Family::gpt2, c.norm_eps,
             tp.sequence_parallel ? kTpAxis : ""),
      norm2_(store, name_ + ".norm2", c.d_model, c.family == Family::gpt2, c.norm_eps,
             tp.sequence_parallel ? kTpAxis : ""),
      attn_(store, name_ + ".attn", c, share_, p, rope, cp),
      ffn_(make_feed_forward(store, name_, layer, c, share_, p, tp, moe)) {}

void Block::bind(ParamStore& store) {
  norm1_.bind(store);
  norm2_.bind(store);
  attn_.bind(store);
  ffn_->bind(store);
}

void Block::reserve_grads(BlockGrads& g, int64_t N) const {
  const int64_t d = cfg_.d_model, n = local_rows(N);
  attn_.reserve(g.attn, N);
  ffn_->reserve(g.ffn, N);
  g.d_h2.fit(N * d);
  g.d_xmid.fit(n * d);
  g.d_h1.fit(N * d);
  if (tp_.sequence_parallel) {
    g.dy_full.fit(N * d);
    g.d_xmid_full.fit(N * d);
    g.d_h2_full.fit(N * d);
    g.d_h1_full.fit(N * d);
    g.gathered.fit(N * d);
    g.partial.fit(N * d);
  }
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

void Block::forward(Saved& s, float* x_out, const float* x_in, const Batch& batch, BlockGrads& g,
                    const KvLayer* cache, float grad_scale, bool count_stats) {
  const int64_t B = batch.B, T = batch.T, N = B * T, n = local_rows(N), d = cfg_.d_model;
  take_spares(s, N);
  s.B = B, s.T = T;
  s.x_in = x_in;
  // Under sequence parallelism a module's input is the shared gathered rows, gathered again for
  // its weight gradient: it keeps no copy of it.
  const bool sp = tp_.sequence_parallel;
  float* partial = sp ? g.partial.data() : nullptr;

  norm1_.forward(s.h1.data(), x_in, n, s.norm1);
  const float* h1 = enter_column(s.h1.data(), g.gathered.data(), N, "attn.qkv");
  attn_.forward(s.attn, sp ? partial : s.x_mid.data(), h1, batch, !sp, cache);
  leave_row(partial, s.x_mid.data(), N);
  attn_.add_bias(s.x_mid.data(), n);
  kernels::add_inplace(s.x_mid.data(), x_in, n * d);

  norm2_.forward(s.h2.data(), s.x_mid.data(), n, s.norm2);
  const float* h2 = enter_column(s.h2.data(), g.gathered.data(), N, "mlp.fc");
  ffn_->forward(*s.ffn, g.ffn, sp ? partial : x_out, h2,
                {batch, N, !sp, grad_scale, count_stats, cache != nullptr});
  leave_row(partial, x_out, N);
  ffn_->add_bias(x_out, n);
  kernels::add_inplace(x_out, s.x_mid.data(), n * d);
}

void Block::take_spares(Saved& s, int64_t N) const {
  const int64_t n = local_rows(N), d = cfg_.d_model;
  for (Buffer<float>* b : {&s.h1, &s.x_mid, &s.h2}) spares_.floats.fill(*b, n * d);
  attn_.take_spares(s.attn, spares_, N);
  if (!s.ffn) s.ffn = ffn_->new_saved();
  ffn_->take_spares(*s.ffn, spares_, N);
}

void Block::release_recomputable(Saved& s) const {
  spares_.floats.give(s.h1);
  spares_.floats.give(s.h2);
  attn_.release_input_copy(s.attn, spares_);
  ffn_->release_activation(*s.ffn, spares_);
}

void Block::release_all(Saved& s) const {
  for (Buffer<float>* b : {&s.h1, &s.x_mid, &s.h2}) spares_.floats.give(*b);
  attn_.give_all(s.attn, spares_);
  ffn_->give_all(*s.ffn, spares_);
  s.release();
}

SavedBytes Block::saved_bytes(int64_t N) const {
  const int64_t n = local_rows(N), d = cfg_.d_model;
  const bool keep_x = !tp_.sequence_parallel;  // as forward passes it
  SavedBytes b = attn_.saved_bytes(N, keep_x);
  b += ffn_->saved_bytes(N, keep_x);
  b.kept += (n * d + 2 * 2 * n) * kFloatBytes;  // x_mid; both norms' means and rstds
  b.recomputable += 2 * n * d * kFloatBytes;    // h1, h2
  b.deferred += 2 * N * d * kFloatBytes;        // d_h1, d_h2
  return b;
}

void Block::recompute_cheap(Saved& s) {
  const int64_t n = local_rows(s.B * s.T);
  take_spares(s, s.B * s.T);
  // The statistics come out as saved: the same kernel on the same input.
  norm1_.forward(s.h1.data(), s.x_in, n, s.norm1);
  norm2_.forward(s.h2.data(), s.x_mid.data(), n, s.norm2);
  attn_.recompute_input_copy(s.attn, s.h1.data());
  ffn_->recompute_activation(*s.ffn, s.h2.data());
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

void Block::backward(Saved& s, float* dx_in, const float* dx_out, BlockGrads& g,
                     BackwardPart part) {
  if (part == BackwardPart::weight) return weight_gradients(s, g);
  const bool defer = part == BackwardPart::input;  // the weight gradients come later
  const int64_t N = s.B * s.T, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  TpComm* comm = tp_.comm;
  if (defer) {  // fitted, not resized: a resize returns the pages
    s.d_h1.fit(N * d);
    s.d_h2.fit(N * d);
  }
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
  float* d_h2 = defer ? s.d_h2.data() : g.d_h2.data();
  float* d_h1 = defer ? s.d_h1.data() : g.d_h1.data();
  float* d_h2_full = sp ? g.d_h2_full.data() : d_h2;
  float* d_h1_full = sp ? g.d_h1_full.data() : d_h1;
  // The gradient of a row-parallel output enters every row: without sequence parallelism it is
  // replicated already; with it, an all-gather (the conjugate of forward's reduce-scatter). The
  // weight gradients hide the collectives: both of a module's under its all-reduce without
  // sequence parallelism; with it, under the all-gather of the stream's gradient that follows.
  TpComm::Wait h2_ready = regather(s.h2.data());
  const float* dy = dx_out;
  if (sp) dy = gathered_rows(*comm, g, dx_out, n * d);
  else tp_pairs::reduce_backward();
  ffn_->backward_input(*s.ffn, g.ffn, d_h2_full, dy, defer);
  TpComm::Wait reduced = start_column_reduce(d_h2_full, d_h2);
  if (!defer && !sp) ffn_->backward_weight(*s.ffn, s.h2.data());
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
      ffn_->backward_weight(*s.ffn, g.gathered.data());
    }
  }
  if (!defer) norm2_.backward_weight(d_h2, s.x_mid.data(), n, s.norm2);
  d_xmid_ready();

  TpComm::Wait h1_ready = regather(s.h1.data());
  attn_.backward_input(s.attn, g.attn, d_h1_full, d_xmid, defer);
  reduced = start_column_reduce(d_h1_full, d_h1);
  if (!defer && !sp) attn_.backward_weight(s.attn, s.h1.data());
  reduced();
  std::memcpy(dx_in, g.d_xmid.data(), n * d * sizeof(float));
  norm1_.backward_input(dx_in, d_h1, s.x_in, n, s.norm1);
  if (sp) {
    // The next block's gradient rows, gathered under this block's last weight gradients.
    start_gather_rows(*comm, g, dx_in, n * d);
    if (!defer) {
      h1_ready();
      attn_.backward_weight(s.attn, g.gathered.data());
    }
  }
  if (!defer) norm1_.backward_weight(d_h1, s.x_in, n, s.norm1);
}

void Block::weight_gradients(Saved& s, BlockGrads& g) {
  const int64_t N = s.B * s.T, n = local_rows(N), d = cfg_.d_model;
  const bool sp = tp_.sequence_parallel;
  // Under sequence parallelism the column-parallel inputs are gathered again, as in backward.
  auto input_of = [&](const Buffer<float>& local) -> const float* {
    if (!sp) return local.data();
    tp_pairs::gather_forward(*tp_.comm, local.data(), g.gathered.data(), n * d)();
    return g.gathered.data();
  };
  ffn_->backward_weight(*s.ffn, input_of(s.h2));
  norm2_.backward_weight(s.d_h2.data(), s.x_mid.data(), n, s.norm2);
  attn_.backward_weight(s.attn, input_of(s.h1));
  norm1_.backward_weight(s.d_h1.data(), s.x_in, n, s.norm1);
}

}  // namespace cleave
