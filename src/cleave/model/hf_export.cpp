#include "cleave/model/hf_export.h"

namespace cleave {

namespace {

struct Exporter {
  const ParamStore& store;
  const float* flat;
  std::vector<HfTensor> out;

  const ParamTensor& get(const std::string& name) const {
    const int i = store.find(name);
    CLEAVE_CHECK(i >= 0, "no parameter " << name);
    return store.tensor(i);
  }
  // Rows [row0, row0 + rows) of a [R, C] parameter, as is.
  void rows(const std::string& hf, const std::string& name, int64_t row0, int64_t nrows) {
    const ParamTensor& t = get(name);
    const int64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
    const float* src = flat + t.offset + row0 * cols;
    std::vector<int64_t> shape = t.shape;
    shape[0] = nrows;
    out.push_back({hf, shape, std::vector<float>(src, src + nrows * cols)});
  }
  void same(const std::string& hf, const std::string& name) { rows(hf, name, 0, get(name).shape[0]); }
  void vector(const std::string& hf, const std::vector<float>& v) {
    out.push_back({hf, {int64_t(v.size())}, v});
  }
  // A [out, in] weight stored as Conv1D's [in, out].
  void transposed(const std::string& hf, const std::string& name) {
    const ParamTensor& t = get(name);
    const int64_t R = t.shape[0], C = t.shape[1];
    std::vector<float> d(R * C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) d[c * R + r] = flat[t.offset + r * C + c];
    out.push_back({hf, {C, R}, std::move(d)});
  }
};

}  // namespace

bool is_mixtral(const ModelConfig& c) {
  return c.family == Family::llama && c.moe_experts > 0 && c.moe_layers() == c.n_layers &&
         c.moe_router == MoeRouter::topk_softmax && c.moe_shared_experts == 0;
}

std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& c, const float* flat,
                                 const std::map<int, std::vector<float>>& router_bias) {
  Exporter e{store, flat, {}};
  // A MoE layer's router (and sigmoid_bias's bias) under `gate`, and each expert (and the shared
  // experts) as the family's MLP, by `mlp(hf prefix, cleave prefix, hidden units)`.
  auto moe_layer = [&](int l, const std::string& b, const std::string& gate,
                       const std::string& expert, const std::string& shared, auto&& mlp) {
    e.same(gate + ".weight", b + ".moe.router.weight");
    if (const auto it = router_bias.find(l); it != router_bias.end())
      e.vector(gate + ".e_score_correction_bias", it->second);
    for (int x = 0; x < c.moe_experts; ++x)
      mlp(expert + "." + std::to_string(x), b + ".moe.experts." + std::to_string(x), c.moe_ffn_hidden);
    if (c.moe_shared_experts > 0)
      mlp(shared, b + ".moe.shared", c.moe_shared_experts * c.moe_ffn_hidden);
  };
  if (c.family == Family::gpt2) {
    e.same("transformer.wte.weight", "embed.wte");
    e.same("transformer.wpe.weight", "embed.wpe");
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = "transformer.h." + std::to_string(l);
      e.same(h + ".ln_1.weight", b + ".norm1.weight");
      e.same(h + ".ln_1.bias", b + ".norm1.bias");
      e.transposed(h + ".attn.c_attn.weight", b + ".attn.qkv.weight");
      e.same(h + ".attn.c_attn.bias", b + ".attn.qkv.bias");
      e.transposed(h + ".attn.c_proj.weight", b + ".attn.out.weight");
      e.same(h + ".attn.c_proj.bias", b + ".attn.out.bias");
      e.same(h + ".ln_2.weight", b + ".norm2.weight");
      e.same(h + ".ln_2.bias", b + ".norm2.bias");
      auto mlp = [&](const std::string& to, const std::string& from, int) {
        e.transposed(to + ".c_fc.weight", from + ".fc.weight");
        e.same(to + ".c_fc.bias", from + ".fc.bias");
        e.transposed(to + ".c_proj.weight", from + ".proj.weight");
        e.same(to + ".c_proj.bias", from + ".proj.bias");
      };
      if (c.is_moe_layer(l))
        moe_layer(l, b, h + ".mlp.gate", h + ".mlp.experts", h + ".mlp.shared_experts", mlp);
      else
        mlp(h + ".mlp", b + ".mlp", c.ffn_hidden);
    }
    e.same("transformer.ln_f.weight", "final_norm.weight");
    e.same("transformer.ln_f.bias", "final_norm.bias");
  } else {
    const int64_t hd = c.head_dim(), q = int64_t(c.n_heads) * hd, kv = int64_t(c.n_kv_heads) * hd;
    e.same("model.embed_tokens.weight", "embed.wte");
    for (int l = 0; l < c.n_layers; ++l) {
      const std::string b = "blocks." + std::to_string(l), h = "model.layers." + std::to_string(l);
      e.same(h + ".input_layernorm.weight", b + ".norm1.weight");
      e.rows(h + ".self_attn.q_proj.weight", b + ".attn.qkv.weight", 0, q);
      e.rows(h + ".self_attn.k_proj.weight", b + ".attn.qkv.weight", q, kv);
      e.rows(h + ".self_attn.v_proj.weight", b + ".attn.qkv.weight", q + kv, kv);
      e.same(h + ".self_attn.o_proj.weight", b + ".attn.out.weight");
      e.same(h + ".post_attention_layernorm.weight", b + ".norm2.weight");
      auto mlp = [&](const std::string& to, const std::string& from, int hidden) {
        e.rows(to + ".gate_proj.weight", from + ".fc.weight", 0, hidden);
        e.rows(to + ".up_proj.weight", from + ".fc.weight", hidden, hidden);
        e.same(to + ".down_proj.weight", from + ".proj.weight");
      };
      // Mixtral's experts: w1 the gate, w3 the up projection, w2 the down projection.
      auto mixtral = [&](const std::string& to, const std::string& from, int hidden) {
        e.rows(to + ".w1.weight", from + ".fc.weight", 0, hidden);
        e.rows(to + ".w3.weight", from + ".fc.weight", hidden, hidden);
        e.same(to + ".w2.weight", from + ".proj.weight");
      };
      if (is_mixtral(c))
        moe_layer(l, b, h + ".block_sparse_moe.gate", h + ".block_sparse_moe.experts", "", mixtral);
      else if (c.is_moe_layer(l))
        moe_layer(l, b, h + ".mlp.gate", h + ".mlp.experts", h + ".mlp.shared_experts", mlp);
      else
        mlp(h + ".mlp", b + ".mlp", c.ffn_hidden);
    }
    e.same("model.norm.weight", "final_norm.weight");
  }
  if (!c.tie_embeddings) e.same("lm_head.weight", "lm_head.weight");
  return std::move(e.out);
}

namespace {

nlohmann::json dense_config(const ModelConfig& c) {
  if (c.family == Family::gpt2)
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.max_seq_len},
            {"n_ctx", c.max_seq_len},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.ffn_hidden},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_eps},
            {"initializer_range", c.init_std},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", "float32"}};
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model},
          {"intermediate_size", c.ffn_hidden},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"max_position_embeddings", c.max_seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"hidden_act", "silu"},
          {"initializer_range", c.init_std},
          {"attention_bias", false},
          {"tie_word_embeddings", c.tie_embeddings},
          {"torch_dtype", "float32"}};
}

}  // namespace

nlohmann::json hf_config(const ModelConfig& c) {
  nlohmann::json j = dense_config(c);
  if (c.moe_experts == 0) return j;
  if (is_mixtral(c)) {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["intermediate_size"] = c.moe_ffn_hidden;
    j["num_local_experts"] = c.moe_experts;
    j["num_experts_per_tok"] = c.moe_top_k;
    j["sliding_window"] = nullptr;
    j["output_router_logits"] = false;
  } else {
    j["architectures"] = {"CleaveMoeForCausalLM"};
    j["model_type"] = "cleave_moe";
    j["base_model_type"] = family_name(c.family);
    j["moe_experts"] = c.moe_experts;
    j["moe_top_k"] = c.moe_top_k;
    j["moe_router"] = moe_router_name(c.moe_router);
    j["moe_shared_experts"] = c.moe_shared_experts;
    j["moe_ffn_hidden"] = c.moe_ffn_hidden;
    j["moe_every"] = c.moe_every;
    j["moe_first_dense"] = c.moe_first_dense;
  }
  // The balancing terms as cleave trains them: the auxiliary loss per sequence (not Mixtral's
  // per batch), the z-loss per token.
  j["router_aux_loss_coef"] = c.moe_aux_loss_coef;
  j["router_z_loss_coef"] = c.moe_z_loss_coef;
  j["router_aux_loss_form"] = "sequence";
  return j;
}

}  // namespace cleave
