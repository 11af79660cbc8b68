#include "cleave/model/gguf_model.h"

#include <cmath>
#include <cstring>
#include <map>

#include "cleave/base/check.h"
#include "cleave/kernels/convert.h"
#include "cleave/model/hf_export.h"

namespace cleave {

namespace {

struct Rename {
  const char* hf;
  const char* gguf;
};

// Hugging Face's names (model/hf_layout.cpp) -> llama.cpp's (its llama-arch.cpp). A layer's
// tensors are named after "model.layers.N." / "transformer.h.N." (and, for an expert, after
// "block_sparse_moe.experts.X."), and become "blk.N." + the GGUF name.
constexpr Rename kWhole[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"transformer.wte.weight", "token_embd.weight"},
    {"transformer.wpe.weight", "position_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"transformer.ln_f.weight", "output_norm.weight"},
    {"transformer.ln_f.bias", "output_norm.bias"},
    {"lm_head.weight", "output.weight"},
};
constexpr Rename kLayer[] = {
    // Llama
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    // GPT-2
    {"ln_1.weight", "attn_norm.weight"},
    {"ln_1.bias", "attn_norm.bias"},
    {"attn.c_attn.weight", "attn_qkv.weight"},
    {"attn.c_attn.bias", "attn_qkv.bias"},
    {"attn.c_proj.weight", "attn_output.weight"},
    {"attn.c_proj.bias", "attn_output.bias"},
    {"ln_2.weight", "ffn_norm.weight"},
    {"ln_2.bias", "ffn_norm.bias"},
    {"mlp.c_fc.weight", "ffn_up.weight"},
    {"mlp.c_fc.bias", "ffn_up.bias"},
    {"mlp.c_proj.weight", "ffn_down.weight"},
    {"mlp.c_proj.bias", "ffn_down.bias"},
};
constexpr Rename kExpert[] = {  // Mixtral's w1, w3, w2: gate, up, down
    {"w1.weight", "ffn_gate_exps.weight"},
    {"w3.weight", "ffn_up_exps.weight"},
    {"w2.weight", "ffn_down_exps.weight"},
};

template <size_t N>
const char* lookup(const Rename (&table)[N], const std::string& hf) {
  for (const Rename& r : table)
    if (hf == r.hf) return r.gguf;
  return nullptr;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The GGUF name of e, and whether it is one expert's share of a stacked tensor.
std::string gguf_name(const HfEntry& e, bool& expert) {
  expert = false;
  if (const char* g = lookup(kWhole, e.hf)) return g;
  for (const std::string prefix : {"model.layers.", "transformer.h."}) {
    if (!starts_with(e.hf, prefix)) continue;
    const size_t dot = e.hf.find('.', prefix.size());
    CLEAVE_CHECK(dot != std::string::npos, "Hugging Face tensor " << e.hf << " has no layer");
    const std::string blk = "blk." + e.hf.substr(prefix.size(), dot - prefix.size()) + ".";
    const std::string rest = e.hf.substr(dot + 1);
    const std::string experts = "block_sparse_moe.experts.";
    if (starts_with(rest, experts)) {
      const size_t after = rest.find('.', experts.size());
      const char* g = after == std::string::npos ? nullptr : lookup(kExpert, rest.substr(after + 1));
      CLEAVE_CHECK(g, "Hugging Face tensor " << e.hf << " has no GGUF name");
      expert = true;
      return blk + g;
    }
    const char* g = lookup(kLayer, rest);
    CLEAVE_CHECK(g, "Hugging Face tensor " << e.hf << " has no GGUF name");
    return blk + g;
  }
  CLEAVE_FAIL("Hugging Face tensor " << e.hf << " has no GGUF name");
}

// The features of c that llama.cpp's architectures lack, as an error naming them.
void check_expressible(const ModelConfig& c) {
  if (c.moe_experts == 0) return;
  std::string why;
  if (c.family == Family::gpt2) why = "a GPT-2 with experts (llama.cpp's gpt2 has none)";
  else if (c.moe_router != MoeRouter::topk_softmax)
    why = std::string("the ") + moe_router_name(c.moe_router) + " router (llama.cpp's llama " +
          "routes as Mixtral: softmax over the top-k logits, model.moe_router = topk_softmax)";
  else if (c.moe_shared_experts > 0) why = "shared experts (model.moe_shared_experts)";
  else if (c.moe_layers() != c.n_layers)
    why = "dense layers among the MoE layers (model.moe_every, model.moe_first_dense): llama.cpp's "
          "llama has experts in every layer or in none";
  if (!why.empty())
    throw Error("GGUF export: llama.cpp cannot express " + why + "; export a Hugging Face folder "
                "instead (cleave export CHECKPOINT OUT_DIR)");
  CLEAVE_CHECK(is_mixtral(c), "a MoE model that passed the GGUF checks is not Mixtral's layout");
}

void add_model_keys(gguf::Metadata& meta, const ModelConfig& c, gguf::TensorType matrices) {
  const std::string arch = c.family == Family::gpt2 ? "gpt2" : "llama";
  meta.add_string("general.architecture", arch);
  // llama_ftype: all f32, mostly f16, mostly bf16.
  meta.add_u32("general.file_type", matrices == gguf::TensorType::f32   ? 0
                                    : matrices == gguf::TensorType::f16 ? 1
                                                                        : 32);
  auto u32 = [&](const char* key, int64_t v) { meta.add_u32(arch + "." + key, uint32_t(v)); };
  u32("vocab_size", c.vocab_size);
  u32("context_length", c.max_seq_len);
  u32("embedding_length", c.d_model);
  u32("block_count", c.n_layers);
  // A Mixtral's layers are all MoE: llama.cpp sizes its experts by feed_forward_length.
  u32("feed_forward_length", c.moe_experts > 0 ? c.moe_ffn_hidden : c.ffn_hidden);
  u32("attention.head_count", c.n_heads);
  u32("attention.head_count_kv", c.n_kv_heads);
  if (c.family == Family::gpt2) {
    meta.add_f32("gpt2.attention.layer_norm_epsilon", c.norm_eps);
    return;
  }
  meta.add_f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  meta.add_f32("llama.rope.freq_base", c.rope_theta);
  u32("rope.dimension_count", c.head_dim());
  if (c.moe_experts > 0) {
    u32("expert_count", c.moe_experts);
    u32("expert_used_count", c.moe_top_k);
  }
}

void encode(const std::vector<float>& v, const GgufTensorPlan& t, gguf::TensorType type,
            std::string& bytes) {
  const int64_t n = int64_t(v.size());
  bytes.resize(size_t(n) * gguf::type_size(type));
  switch (type) {
    case gguf::TensorType::f32: std::memcpy(bytes.data(), v.data(), bytes.size()); break;
    case gguf::TensorType::bf16:
      kernels::f32_to_bf16(reinterpret_cast<bf16*>(bytes.data()), v.data(), n);
      break;
    case gguf::TensorType::f16:
      for (int64_t i = 0; i < n; ++i)
        if (std::isfinite(v[size_t(i)]) && std::fabs(v[size_t(i)]) > 65504.0f)
          throw Error("GGUF export: tensor " + t.name + " holds " + std::to_string(v[size_t(i)]) +
                      ", beyond f16's largest value (65504): export it as bf16 or f32");
      kernels::f32_to_f16(reinterpret_cast<uint16_t*>(bytes.data()), v.data(), n);
      break;
  }
}

}  // namespace

std::vector<GgufTensorPlan> gguf_tensor_plan(const ModelConfig& c) {
  check_expressible(c);
  std::vector<GgufTensorPlan> plan;
  std::map<std::string, size_t> stacked;  // an experts tensor's name -> its place in plan
  visit_hf_layout(c, [&](const HfEntry& hf) {
    bool expert = false;
    const std::string name = gguf_name(hf, expert);
    HfEntry e = hf;
    if (e.layout == HfLayout::transposed) e.layout = HfLayout::same;  // GGUF keeps [out, in]
    if (expert) {
      const auto [it, fresh] = stacked.emplace(name, plan.size());
      if (!fresh) {
        plan[it->second].parts.push_back(e);
        ++plan[it->second].shape[0];
        return true;
      }
    }
    GgufTensorPlan t{name, e.hf_shape(), {e}};
    if (expert) t.shape.insert(t.shape.begin(), 1);
    if (c.family == Family::llama && name.ends_with(".attn_q.weight")) t.rope_heads = c.n_heads;
    if (c.family == Family::llama && name.ends_with(".attn_k.weight")) t.rope_heads = c.n_kv_heads;
    t.keep_f32 = t.shape.size() == 1 || name.ends_with(".ffn_gate_inp.weight");
    plan.push_back(std::move(t));
    return true;
  });
  return plan;
}

std::vector<gguf::TensorInfo> gguf_tensor_infos(const std::vector<GgufTensorPlan>& plan,
                                                gguf::TensorType matrices) {
  std::vector<gguf::TensorInfo> infos;
  for (const GgufTensorPlan& t : plan)
    infos.push_back({t.name, t.shape, t.keep_f32 ? gguf::TensorType::f32 : matrices});
  return infos;
}

void gguf_rope_rows(float* w, int heads, int64_t head_dim, int64_t cols) {
  CLEAVE_CHECK(head_dim % 2 == 0, "rotary head_dim " << head_dim << " is odd");
  const int64_t half = head_dim / 2;
  std::vector<float> head(size_t(head_dim * cols));
  for (int h = 0; h < heads; ++h) {
    float* rows = w + h * head_dim * cols;
    std::memcpy(head.data(), rows, head.size() * sizeof(float));
    for (int64_t i = 0; i < half; ++i)
      for (int64_t t = 0; t < 2; ++t)
        std::memcpy(rows + (2 * i + t) * cols, head.data() + (t * half + i) * cols,
                    size_t(cols) * sizeof(float));
  }
}

void write_gguf_model(std::ostream& out, gguf::Metadata meta, const ModelConfig& c,
                      const ParamStore& store, const float* flat, gguf::TensorType matrices) {
  const std::vector<GgufTensorPlan> plan = gguf_tensor_plan(c);
  add_model_keys(meta, c, matrices);
  const std::vector<gguf::TensorInfo> infos = gguf_tensor_infos(plan, matrices);
  std::vector<float> values;
  gguf::write(out, meta, infos, [&](size_t i, std::string& bytes) {
    const GgufTensorPlan& t = plan[i];
    values.resize(size_t(infos[i].numel()));
    float* at = values.data();
    for (const HfEntry& e : t.parts) {
      e.to_hf(hf_source(store, e, flat), at);
      at += e.hf_numel();
    }
    if (t.rope_heads > 0) gguf_rope_rows(values.data(), t.rope_heads, c.head_dim(), c.d_model);
    encode(values, t, infos[i].type, bytes);
  });
}

}  // namespace cleave
