#include "cleave/model/hf_layout.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave {

std::vector<int64_t> HfEntry::hf_shape() const {
  switch (layout) {
    case HfLayout::rows: return {rows, param_shape[1]};
    case HfLayout::transposed: return {param_shape[1], param_shape[0]};
    case HfLayout::same:
    case HfLayout::router_bias: break;
  }
  return param_shape;
}

int64_t HfEntry::hf_numel() const {
  int64_t n = 1;
  for (int64_t d : hf_shape()) n *= d;
  return n;
}

void HfEntry::to_hf(const float* param, float* hf) const {
  const int64_t n = hf_numel();
  if (layout == HfLayout::transposed) {
    const int64_t R = param_shape[0], C = param_shape[1];
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) hf[c * R + r] = param[r * C + c];
  } else {
    const int64_t first = layout == HfLayout::rows ? row0 * param_shape[1] : 0;
    std::copy(param + first, param + first + n, hf);
  }
}

void HfEntry::from_hf(const float* hf, float* param) const {
  const int64_t n = hf_numel();
  if (layout == HfLayout::transposed) {
    const int64_t R = param_shape[0], C = param_shape[1];
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r) param[r * C + c] = hf[c * R + r];
  } else {
    const int64_t first = layout == HfLayout::rows ? row0 * param_shape[1] : 0;
    std::copy(hf, hf + n, param + first);
  }
}

bool is_mixtral(const ModelConfig& c) {
  return c.family == Family::llama && c.moe_experts > 0 && c.moe_layers() == c.n_layers &&
         c.moe_router == MoeRouter::topk_softmax && c.moe_shared_experts == 0;
}

namespace {

// The table's rows, written as the model is built: one call per Hugging Face tensor.
struct Table {
  const std::function<bool(const HfEntry&)>& visit;
  bool going = true;

  void emit(HfEntry e) {
    if (going) going = visit(e);
  }
  void same(const std::string& hf, const std::string& param, std::vector<int64_t> shape) {
    emit({hf, param, HfLayout::same, std::move(shape)});
  }
  // Rows [row0, row0 + rows) of param, a [R, C] tensor.
  void rows(const std::string& hf, const std::string& param, std::vector<int64_t> shape,
            int64_t row0, int64_t rows) {
    emit({hf, param, HfLayout::rows, std::move(shape), row0, rows});
  }
  void transposed(const std::string& hf, const std::string& param, std::vector<int64_t> shape) {
    emit({hf, param, HfLayout::transposed, std::move(shape)});
  }
  void router_bias(const std::string& hf, int layer, int64_t experts) {
    emit({hf, "", HfLayout::router_bias, {experts}, 0, 0, layer});
  }
};

}  // namespace

void visit_hf_layout(const ModelConfig& c, const std::function<bool(const HfEntry&)>& visit) {
  Table t{visit};
  const int64_t d = c.d_model, V = c.vocab_size, E = c.moe_experts;
  const int64_t hd = c.head_dim(), q = int64_t(c.n_heads) * hd, kv = int64_t(c.n_kv_heads) * hd;
  // A MoE layer's router (and sigmoid_bias's bias) under `gate`, and each expert (and the shared
  // experts) as the family's MLP, by `mlp(hf prefix, cleave prefix, hidden units)`.
  auto moe_layer = [&](int l, const std::string& b, const std::string& gate,
                       const std::string& expert, const std::string& shared, auto&& mlp) {
    t.same(gate + ".weight", b + ".moe.router.weight", {E, d});
    if (c.moe_router == MoeRouter::sigmoid_bias)
      t.router_bias(gate + ".e_score_correction_bias", l, E);
    for (int x = 0; x < c.moe_experts && t.going; ++x)
      mlp(expert + "." + std::to_string(x), b + ".moe.experts." + std::to_string(x),
          int64_t(c.moe_ffn_hidden));
    if (c.moe_shared_experts > 0)
      mlp(shared, b + ".moe.shared", int64_t(c.moe_shared_experts) * c.moe_ffn_hidden);
  };
  if (c.family == Family::gpt2) {
    t.same("transformer.wte.weight", "embed.wte", {V, d});
    t.same("transformer.wpe.weight", "embed.wpe", {c.max_seq_len, d});
    for (int l = 0; l < c.n_layers && t.going; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = "transformer.h." + std::to_string(l);
      t.same(h + ".ln_1.weight", b + ".norm1.weight", {d});
      t.same(h + ".ln_1.bias", b + ".norm1.bias", {d});
      t.transposed(h + ".attn.c_attn.weight", b + ".attn.qkv.weight", {c.qkv_dim(), d});
      t.same(h + ".attn.c_attn.bias", b + ".attn.qkv.bias", {c.qkv_dim()});
      t.transposed(h + ".attn.c_proj.weight", b + ".attn.out.weight", {d, q});
      t.same(h + ".attn.c_proj.bias", b + ".attn.out.bias", {d});
      t.same(h + ".ln_2.weight", b + ".norm2.weight", {d});
      t.same(h + ".ln_2.bias", b + ".norm2.bias", {d});
      auto mlp = [&](const std::string& to, const std::string& from, int64_t hidden) {
        t.transposed(to + ".c_fc.weight", from + ".fc.weight", {hidden, d});
        t.same(to + ".c_fc.bias", from + ".fc.bias", {hidden});
        t.transposed(to + ".c_proj.weight", from + ".proj.weight", {d, hidden});
        t.same(to + ".c_proj.bias", from + ".proj.bias", {d});
      };
      if (c.is_moe_layer(l))
        moe_layer(l, b, h + ".mlp.gate", h + ".mlp.experts", h + ".mlp.shared_experts", mlp);
      else
        mlp(h + ".mlp", b + ".mlp", c.ffn_hidden);
    }
    t.same("transformer.ln_f.weight", "final_norm.weight", {d});
    t.same("transformer.ln_f.bias", "final_norm.bias", {d});
  } else {
    t.same("model.embed_tokens.weight", "embed.wte", {V, d});
    for (int l = 0; l < c.n_layers && t.going; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = "model.layers." + std::to_string(l);
      const std::string qkv = b + ".attn.qkv.weight";
      t.same(h + ".input_layernorm.weight", b + ".norm1.weight", {d});
      t.rows(h + ".self_attn.q_proj.weight", qkv, {q + 2 * kv, d}, 0, q);
      t.rows(h + ".self_attn.k_proj.weight", qkv, {q + 2 * kv, d}, q, kv);
      t.rows(h + ".self_attn.v_proj.weight", qkv, {q + 2 * kv, d}, q + kv, kv);
      t.same(h + ".self_attn.o_proj.weight", b + ".attn.out.weight", {d, q});
      t.same(h + ".post_attention_layernorm.weight", b + ".norm2.weight", {d});
      // SwiGLU's gate and up projections are the two halves of fc's rows; Mixtral's experts
      // call them w1 (gate), w3 (up) and w2 (down).
      auto swiglu = [&](const char* gate, const char* up, const char* down) {
        return [&t, &d, gate, up, down](const std::string& to, const std::string& from,
                                        int64_t hidden) {
          t.rows(to + "." + gate + ".weight", from + ".fc.weight", {2 * hidden, d}, 0, hidden);
          t.rows(to + "." + up + ".weight", from + ".fc.weight", {2 * hidden, d}, hidden, hidden);
          t.same(to + "." + down + ".weight", from + ".proj.weight", {d, hidden});
        };
      };
      if (is_mixtral(c))
        moe_layer(l, b, h + ".block_sparse_moe.gate", h + ".block_sparse_moe.experts", "",
                  swiglu("w1", "w3", "w2"));
      else if (c.is_moe_layer(l))
        moe_layer(l, b, h + ".mlp.gate", h + ".mlp.experts", h + ".mlp.shared_experts",
                  swiglu("gate_proj", "up_proj", "down_proj"));
      else
        swiglu("gate_proj", "up_proj", "down_proj")(h + ".mlp", b + ".mlp", c.ffn_hidden);
    }
    t.same("model.norm.weight", "final_norm.weight", {d});
  }
  if (!c.tie_embeddings) t.same("lm_head.weight", "lm_head.weight", {V, d});
}

std::vector<HfEntry> hf_layout(const ModelConfig& c) {
  std::vector<HfEntry> out;
  visit_hf_layout(c, [&](const HfEntry& e) {
    out.push_back(e);
    return true;
  });
  return out;
}

}  // namespace cleave
