#include "cleave/model/mlp.h"

#include <cstring>

#include "cleave/kernels/activation.h"

namespace cleave {

namespace {

// fc's rows on a tp rank: its hidden units, and for SwiGLU the same units of the up projection
// (none at tp = 1: the whole tensor).
Placement fc_placement(const ModelConfig& c, const TpShare& s, int hidden) {
  if (s.tp == 1) return {};
  const int64_t f = hidden / s.tp;
  std::vector<Segment> segments = {{0, s.rank * f, f, ""}};
  if (c.family == Family::llama) segments.push_back({f, hidden + s.rank * f, f, ""});
  const int64_t rows = c.family == Family::llama ? 2 * hidden : hidden;
  return shard_rows({rows, c.d_model}, std::move(segments));
}

}  // namespace

void Mlp::Saved::release() {
  for (Buffer<float>* b : {&fc, &act, &dy, &d_fc}) *b = Buffer<float>();
  x_copy = OperandCopy();
  act_copy = OperandCopy();
  N = 0;
}

Mlp::Mlp(ParamStore& store, const std::string& name, const ModelConfig& c, const TpShare& share,
         Precision p, int hidden, int group)
    : cfg_(c), hidden_(hidden > 0 ? hidden : c.ffn_hidden), ffn_(hidden_ / share.tp),
      fc_(store, name + ".fc", c.d_model, c.family == Family::llama ? 2 * ffn_ : ffn_,
          c.family == Family::gpt2, c.init_std, p, fc_placement(c, share, hidden_), group),
      proj_(store, name + ".proj", ffn_, c.d_model, c.family == Family::gpt2,
            c.residual_init_std(), p, row_parallel(share, c.d_model, hidden_, ffn_), group) {}

void Mlp::bind(ParamStore& store) {
  fc_.bind(store);
  proj_.bind(store);
}

void Mlp::reserve(Scratch& g, int64_t N) const {
  g.d_act.fit(N * ffn_);
  if (fc_grad_in_fp32()) g.d_fc.fit(N * fc_.gemm().out_features());
}

void Mlp::forward(Saved& s, float* y, const float* x, int64_t N, bool keep_x) {
  // Buffers only grow: an expert's rows change every step, and a buffer allocated anew each
  // time would fault its pages in again.
  s.fc.grow(N * fc_.gemm().out_features());
  s.N = N;
  s.x_kept = keep_x;
  fc_.forward(s.fc.data(), x, N, keep_x ? &s.x_copy : nullptr);
  activate(s);
  if (act_in_fp32()) proj_.forward(y, s.act.data(), N, &s.act_copy);
  else proj_.forward_from_copy(y, s.act_copy, N);
}

// In bf16 mode the activation goes straight to the bf16 operand of proj: one pass, and no fp32
// activation written, kept or read again to convert it.
void Mlp::activate(Saved& s) const {
  const int64_t N = s.N;
  auto write = [&](auto* out) {
    if (cfg_.family == Family::gpt2)
      kernels::gelu_forward(out, s.fc.data(), N * ffn_);
    else
      kernels::swiglu_forward(out, s.fc.data(), N, ffn_);
  };
  if (act_in_fp32()) write(s.act.grow(N * ffn_));
  else write(s.act_copy.refill(N * ffn_));
}

void Mlp::release_activation(Saved& s, RecomputeSpares& spares) const {
  spares.floats.give(s.act);
  spares.copies.give(s.x_copy.data);
  spares.copies.give(s.act_copy.data);
  s.x_copy.count = s.act_copy.count = 0;
}

void Mlp::give_all(Saved& s, RecomputeSpares& spares) const {
  spares.floats.give(s.fc);
  release_activation(s, spares);
  s.release();
}

void Mlp::take_spares(Saved& s, RecomputeSpares& spares, int64_t N) const {
  spares.floats.fill(s.fc, N * fc_.gemm().out_features());
  if (act_in_fp32()) spares.floats.fill(s.act, N * ffn_);
  spares.copies.reuse(s.x_copy.data, N * fc_.gemm().in_features());
  spares.copies.reuse(s.act_copy.data, N * ffn_);
}

SavedBytes Mlp::saved_bytes(int64_t N, bool keep_x) const {
  SavedBytes b;
  b.kept = N * fc_width() * kFloatBytes;
  b.recomputable = (act_in_fp32() ? N * act_width() * kFloatBytes : 0) +
                   proj_.gemm().kept_copy_bytes(N) +
                   (keep_x ? fc_.gemm().kept_copy_bytes(N) : 0);
  b.deferred = N * (cfg_.d_model + fc_width()) * kFloatBytes;  // dy, d_fc
  return b;
}

void Mlp::recompute_activation(Saved& s, const float* x) {
  activate(s);
  if (act_in_fp32()) proj_.gemm().copy_operand(s.act.data(), s.N * ffn_, s.act_copy);
  if (s.x_kept) fc_.gemm().copy_operand(x, s.N * fc_.gemm().in_features(), s.x_copy);
}

void Mlp::backward_input(Saved& s, Scratch& g, float* dx, const float* dy, bool defer) {
  const int64_t N = s.N, d = cfg_.d_model;
  if (defer) {  // fitted, not resized: a resize returns the pages
    s.dy.fit(N * d);
    s.d_fc.fit(N * fc_.gemm().out_features());
  }
  // bf16 mode, not deferred: the activation's backward writes fc's gradient as the bf16 operand of
  // its products in the same pass; GPT-2's adds fc's bias gradient there too (the copy says so).
  const bool fused = !act_in_fp32() && !defer;
  float* d_fc = defer ? s.d_fc.data() : fc_grad_in_fp32() ? g.d_fc.data() : nullptr;
  proj_.backward_input(g.d_act.data(), dy, N, false, defer ? nullptr : &g.dy_copy);
  if (fused) {
    bf16* rounded = g.dfc_copy.refill(N * fc_.gemm().out_features());
    if (cfg_.family == Family::gpt2) {
      kernels::gelu_backward_bias(rounded, fc_.bias_grad(), g.d_act.data(), s.fc.data(), N, ffn_);
      g.dfc_copy.bias_summed = true;
    } else {
      kernels::swiglu_backward(rounded, g.d_act.data(), s.fc.data(), N, ffn_);
    }
  } else if (cfg_.family == Family::gpt2) {
    kernels::gelu_backward(d_fc, g.d_act.data(), s.fc.data(), N * ffn_);
  } else {
    kernels::swiglu_backward(d_fc, g.d_act.data(), s.fc.data(), N, ffn_);
  }
  if (fused) fc_.backward_input_from_copy(dx, g.dfc_copy, N, false);
  else fc_.backward_input(dx, d_fc, N, false, defer ? nullptr : &g.dfc_copy);
  if (defer) std::memcpy(s.dy.data(), dy, N * d * sizeof(float));
  // The output gradients' bf16 copies serve the weight gradients of a whole backward only.
  if (defer) s.weight = {s.dy.data(), d_fc, nullptr, nullptr};
  else s.weight = {dy, d_fc, &g.dy_copy, &g.dfc_copy};
}

void Mlp::backward_weight(Saved& s, const float* x) {
  const WeightGradInputs& w = s.weight;
  proj_.backward_weight(w.dy, act_in_fp32() ? s.act.data() : nullptr, s.N, w.dy_copy,
                        &s.act_copy);
  fc_.backward_weight(w.inner, x, s.N, w.inner_copy, s.x_kept ? &s.x_copy : nullptr);
}

}  // namespace cleave
