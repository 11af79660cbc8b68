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

std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& c, const float* flat) {
  Exporter e{store, flat, {}};
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
      e.transposed(h + ".mlp.c_fc.weight", b + ".mlp.fc.weight");
      e.same(h + ".mlp.c_fc.bias", b + ".mlp.fc.bias");
      e.transposed(h + ".mlp.c_proj.weight", b + ".mlp.proj.weight");
      e.same(h + ".mlp.c_proj.bias", b + ".mlp.proj.bias");
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
      e.rows(h + ".mlp.gate_proj.weight", b + ".mlp.fc.weight", 0, c.ffn_hidden);
      e.rows(h + ".mlp.up_proj.weight", b + ".mlp.fc.weight", c.ffn_hidden, c.ffn_hidden);
      e.same(h + ".mlp.down_proj.weight", b + ".mlp.proj.weight");
    }
    e.same("model.norm.weight", "final_norm.weight");
  }
  if (!c.tie_embeddings) e.same("lm_head.weight", "lm_head.weight");
  return std::move(e.out);
}

nlohmann::json hf_config(const ModelConfig& c) {
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

}  // namespace cleave
