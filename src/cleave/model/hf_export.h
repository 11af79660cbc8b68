// The model's tensors under Hugging Face names and layouts (GPT2LMHeadModel or LlamaForCausalLM)
// and the matching config.json. GPT-2 stores its linear weights as Conv1D, [in, out]; Llama keeps
// q, k, v and gate, up as separate tensors. Works on any flat buffer laid out like the parameters,
// so gradients map the same way as values.
// A mixture of experts (docs/checkpoints.md, "Mixture of experts"): a Llama whose every layer is
// MoE with Mixtral's router and no shared experts is MixtralForCausalLM (block_sparse_moe.gate,
// block_sparse_moe.experts.N.w1 / w2 / w3); any other is model_type "cleave_moe", the family's
// names with DeepSeek-V3's in each MoE layer (mlp.gate, mlp.gate.e_score_correction_bias,
// mlp.experts.N.*, mlp.shared_experts.*) and the moe_* keys in config.json.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/model/model_config.h"
#include "cleave/model/params.h"

namespace cleave {

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// router_bias: sigmoid_bias's bias per MoE layer (by layer; Transformer::moe_biases).
std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& cfg, const float* flat,
                                 const std::map<int, std::vector<float>>& router_bias = {});
nlohmann::json hf_config(const ModelConfig& cfg);
bool is_mixtral(const ModelConfig& cfg);  // exported as MixtralForCausalLM

}  // namespace cleave
