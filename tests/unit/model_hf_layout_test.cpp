// The one table of Hugging Face names and layouts, read both ways: for every family and mixture
// of experts, its cleave shapes are the model's, it covers every element of every parameter once,
// and import's direction undoes export's; config.json's keys map to [model]'s and back, and every
// config.json cleave cannot honour is refused with a message naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "cleave/model/hf_config.h"
#include "cleave/model/hf_export.h"
#include "cleave/model/transformer.h"

namespace cleave {
namespace {

ModelConfig tiny(Family family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 40;
  c.d_model = 16;
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.ffn_hidden = 24;
  c.max_seq_len = 12;
  c.tie_embeddings = family == Family::gpt2;
  return c;
}

std::map<std::string, ModelConfig> variants() {
  std::map<std::string, ModelConfig> v;
  v["gpt2"] = tiny(Family::gpt2);
  v["gpt2_untied"] = tiny(Family::gpt2);
  v["gpt2_untied"].tie_embeddings = false;
  v["llama"] = tiny(Family::llama);
  v["llama_gqa_tied"] = tiny(Family::llama);
  v["llama_gqa_tied"].n_kv_heads = 2;
  v["llama_gqa_tied"].tie_embeddings = true;
  ModelConfig mixtral = tiny(Family::llama);
  mixtral.n_kv_heads = 1;
  mixtral.moe_experts = 3;
  mixtral.moe_ffn_hidden = 8;
  v["mixtral"] = mixtral;
  ModelConfig moe = tiny(Family::gpt2);
  moe.moe_experts = 4;
  moe.moe_ffn_hidden = 8;
  moe.moe_shared_experts = 1;
  moe.moe_router = MoeRouter::sigmoid_bias;
  moe.moe_every = 2;
  v["cleave_moe_gpt2"] = moe;
  moe.family = Family::llama;
  moe.moe_router = MoeRouter::softmax_topk;
  moe.moe_first_dense = 1;
  moe.moe_every = 1;
  v["cleave_moe_llama"] = moe;
  return v;
}

TEST(HfLayout, CoversEveryParameterOnceAndImportUndoesExport) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    ASSERT_EQ(is_mixtral(c), name == "mixtral");
    Transformer model(c, Precision::fp32, 3);
    ParamStore& params = model.params();
    // Every element its own value, padding NaN: what import writes back must be exactly it.
    std::vector<float> original(size_t(params.total()), std::numeric_limits<float>::quiet_NaN());
    for (const ParamTensor& t : params.tensors())
      for (int64_t i = 0; i < t.numel; ++i) original[size_t(t.offset + i)] = float(t.offset + i);
    std::vector<float> back(original.size(), std::numeric_limits<float>::quiet_NaN());
    std::map<std::string, int64_t> filled;
    const std::vector<HfEntry> table = hf_layout(c);
    int biases = 0;
    for (const HfEntry& e : table) {
      if (e.layout == HfLayout::router_bias) {
        ++biases;
        continue;
      }
      const int i = params.find(e.param);
      ASSERT_GE(i, 0) << e.param;
      const ParamTensor& t = params.tensor(i);
      ASSERT_EQ(t.shape, e.param_shape) << e.hf;
      std::vector<float> hf(size_t(e.hf_numel()));
      e.to_hf(original.data() + t.offset, hf.data());
      e.from_hf(hf.data(), back.data() + t.offset);
      filled[e.param] += e.hf_numel();
    }
    EXPECT_EQ(biases, c.moe_router == MoeRouter::sigmoid_bias ? c.moe_layers() : 0);
    for (const ParamTensor& t : params.tensors()) EXPECT_EQ(filled[t.name], t.numel) << t.name;
    for (const ParamTensor& t : params.tensors())
      for (int64_t i = 0; i < t.numel; ++i)
        ASSERT_EQ(back[size_t(t.offset + i)], original[size_t(t.offset + i)]) << t.name << " " << i;
    // hf_tensors is the table read from the model.
    const std::vector<HfTensor> exported = hf_tensors(params, c, original.data(),
                                                      model.moe_bias_values());
    ASSERT_EQ(exported.size(), table.size());
    for (size_t k = 0; k < table.size(); ++k) EXPECT_EQ(exported[k].name, table[k].hf);
  }
}

TEST(HfLayout, ShapesAndLayoutsAreHuggingFaces) {
  ModelConfig c = tiny(Family::gpt2);
  std::map<std::string, HfEntry> gpt2;
  for (const HfEntry& e : hf_layout(c)) gpt2[e.hf] = e;
  const HfEntry& attn = gpt2.at("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(attn.hf_shape(), (std::vector<int64_t>{16, 48}));  // Conv1D: [in, out]
  // Element [r, c] of cleave's [out, in] weight is element [c, r] of Conv1D's.
  std::vector<float> param(48 * 16), hf(48 * 16);
  for (size_t i = 0; i < param.size(); ++i) param[i] = float(i);
  attn.to_hf(param.data(), hf.data());
  EXPECT_EQ(hf[5 * 48 + 7], param[7 * 16 + 5]);
  EXPECT_FALSE(gpt2.count("lm_head.weight"));

  c = tiny(Family::llama);
  c.n_kv_heads = 2;
  std::map<std::string, HfEntry> llama;
  for (const HfEntry& e : hf_layout(c)) llama[e.hf] = e;
  // qkv's rows: q (4 heads of 4), then k and v (2 heads each).
  const HfEntry& k = llama.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k.param, "blocks.0.attn.qkv.weight");
  EXPECT_EQ(k.hf_shape(), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(k.row0, 16);
  EXPECT_EQ(llama.at("model.layers.0.self_attn.v_proj.weight").row0, 24);
  EXPECT_EQ(llama.at("model.layers.2.mlp.up_proj.weight").row0, 24);  // fc: [gate | up]
  EXPECT_TRUE(llama.count("lm_head.weight"));
}

// Stops at the first tensor the visitor refuses: a config of a huge model costs nothing.
TEST(HfLayout, VisitStops) {
  ModelConfig c = tiny(Family::llama);
  c.n_layers = 1024;
  c.moe_experts = 1 << 16;
  c.moe_ffn_hidden = 8;
  int seen = 0;
  visit_hf_layout(c, [&](const HfEntry&) { return ++seen < 10; });
  EXPECT_EQ(seen, 10);
}

// Import's reading of what export writes is the model (every key cleave's [model] writes that
// matters to it), and a fixed point.
TEST(HfConfig, RoundTrips) {
  for (const auto& [name, c] : variants()) {
    SCOPED_TRACE(name);
    const nlohmann::json written = hf_config(c);
    const ModelConfig back = model_config_from_hf(written, "config.json");
    EXPECT_EQ(hf_config(back), written);
    EXPECT_EQ(back.family, c.family);
    EXPECT_EQ(back.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(back.tie_embeddings, c.tie_embeddings);
    EXPECT_EQ(back.norm_eps, c.norm_eps);
    EXPECT_EQ(back.moe_experts, c.moe_experts);
    EXPECT_EQ(back.moe_router, c.moe_router);
    EXPECT_EQ(hf_layout(back).size(), hf_layout(c).size());
  }
}

// What transformers writes for GPT-2 (n_inner null, dropouts, extra keys) and for Llama (defaults
// left out) reads as Hugging Face means it.
TEST(HfConfig, ReadsTransformersDefaults) {
  const ModelConfig g = model_config_from_hf(
      {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", 50257},
       {"n_embd", 768}, {"n_layer", 12}, {"n_head", 12}, {"n_inner", nullptr}, {"n_ctx", 1024},
       {"resid_pdrop", 0.1}, {"use_cache", true}, {"task_specific_params", {{"a", 1}}}},
      "gpt2/config.json");
  EXPECT_EQ(g.ffn_hidden, 4 * 768);
  EXPECT_EQ(g.max_seq_len, 1024);
  EXPECT_TRUE(g.tie_embeddings);
  EXPECT_FLOAT_EQ(g.norm_eps, 1e-5f);
  const ModelConfig l = model_config_from_hf(
      {{"model_type", "llama"}, {"vocab_size", 32000}, {"hidden_size", 256},
       {"intermediate_size", 688}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
       {"head_dim", 32}, {"rope_scaling", nullptr}, {"torch_dtype", "bfloat16"}},
      "llama/config.json");
  EXPECT_EQ(l.n_kv_heads, 8);
  EXPECT_FALSE(l.tie_embeddings);
  EXPECT_EQ(l.max_seq_len, 2048);
  EXPECT_FLOAT_EQ(l.norm_eps, 1e-6f);
  const ModelConfig m = model_config_from_hf(
      {{"model_type", "mixtral"}, {"vocab_size", 32000}, {"hidden_size", 256},
       {"intermediate_size", 512}, {"num_hidden_layers", 2}, {"num_attention_heads", 8},
       {"max_position_embeddings", 1024}, {"sliding_window", 4096}},
      "mixtral/config.json");
  EXPECT_EQ(m.n_kv_heads, 8);
  EXPECT_EQ(m.moe_experts, 8);
  EXPECT_EQ(m.moe_top_k, 2);
  EXPECT_EQ(m.moe_ffn_hidden, 512);
  EXPECT_EQ(m.rope_theta, 1e6f);
  EXPECT_TRUE(is_mixtral(m));
}

void expect_refused(nlohmann::json config, const std::vector<std::string>& named) {
  try {
    model_config_from_hf(config, "hf/config.json");
    ADD_FAILURE() << "accepted " << config.dump();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("hf/config.json", 0), 0u) << what;
    for (const std::string& n : named)
      EXPECT_NE(what.find(n), std::string::npos) << n << ": " << what;
  }
}

TEST(HfConfig, RefusesWhatCleaveCannotHonour) {
  const nlohmann::json llama = hf_config(tiny(Family::llama));
  const nlohmann::json gpt2 = hf_config(tiny(Family::gpt2));
  auto with = [](nlohmann::json j, const std::string& key, nlohmann::json v) {
    j[key] = v;
    return j;
  };
  auto without = [](nlohmann::json j, const std::string& key) {
    j.erase(key);
    return j;
  };
  expect_refused(with(llama, "model_type", "bert"), {"model_type", "bert"});
  expect_refused(without(llama, "model_type"), {"model_type"});
  expect_refused(with(llama, "architectures", {"LlamaForSequenceClassification"}),
                 {"architectures", "LlamaForSequenceClassification", "LlamaForCausalLM"});
  expect_refused(without(llama, "hidden_size"), {"hidden_size", "model.d_model"});
  expect_refused(with(llama, "hidden_size", 0), {"hidden_size", "out of range"});
  expect_refused(with(llama, "hidden_size", "big"), {"hidden_size", "must be an integer"});
  expect_refused(with(llama, "num_attention_heads", 5),
                 {"hidden_size (model.d_model)", "num_attention_heads (model.n_heads)"});
  expect_refused(with(llama, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}}),
                 {"rope_scaling"});
  expect_refused(with(llama, "hidden_act", "gelu"), {"hidden_act", "gelu", "silu"});
  expect_refused(with(llama, "attention_bias", true), {"attention_bias"});
  expect_refused(with(llama, "mlp_bias", true), {"mlp_bias"});
  expect_refused(with(llama, "head_dim", 8), {"head_dim"});
  expect_refused(with(hf_config(variants().at("mixtral")), "sliding_window", 4),
                 {"sliding_window"});
  expect_refused(with(gpt2, "activation_function", "relu"), {"activation_function"});
  expect_refused(with(gpt2, "n_ctx", 13), {"n_ctx", "n_positions", "model.max_seq_len"});
  expect_refused(with(gpt2, "scale_attn_by_inverse_layer_idx", true),
                 {"scale_attn_by_inverse_layer_idx"});
  expect_refused(with(gpt2, "vocab_size", 1e12), {"vocab_size"});
  nlohmann::json moe = hf_config(variants().at("cleave_moe_gpt2"));
  expect_refused(with(moe, "base_model_type", "bert"), {"base_model_type"});
  expect_refused(with(moe, "moe_router", "hash"), {"moe_router", "hash"});
  // cleave writes a Llama of only MoE layers with Mixtral's router as mixtral, never as cleave_moe.
  nlohmann::json mixtral_shaped = hf_config(variants().at("mixtral"));
  mixtral_shaped["model_type"] = "cleave_moe";
  mixtral_shaped["architectures"] = {"CleaveMoeForCausalLM"};
  mixtral_shaped["base_model_type"] = "llama";
  for (auto [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"moe_experts", 3}, {"moe_top_k", 2}, {"moe_router", "topk_softmax"},
           {"moe_shared_experts", 0}, {"moe_ffn_hidden", 8}, {"moe_every", 1},
           {"moe_first_dense", 0}})
    mixtral_shaped[key] = value;
  expect_refused(mixtral_shaped, {"mixtral"});
}

}  // namespace
}  // namespace cleave
