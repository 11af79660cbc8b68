// Hugging Face's names and layouts of cleave's parameters (docs/checkpoints.md): one table that
// export reads from cleave's tensors to Hugging Face's and import from Hugging Face's to cleave's,
// so the two directions cannot drift apart.
// GPT2LMHeadModel stores its linear weights as Conv1D, [in, out]; LlamaForCausalLM keeps q, k, v
// and gate, up as separate tensors, which cleave fuses (rows of attn.qkv.weight and mlp.fc.weight).
// A mixture of experts: a Llama whose every layer is MoE with Mixtral's router and no shared
// experts is MixtralForCausalLM (block_sparse_moe.gate, block_sparse_moe.experts.N.w1 / w2 / w3);
// any other is model_type "cleave_moe", the family's names with DeepSeek-V3's in each MoE layer
// (mlp.gate, mlp.gate.e_score_correction_bias, mlp.experts.N.*, mlp.shared_experts.*).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"

namespace cleave {

enum class HfLayout {
  same,         // the tensor as it is
  rows,         // rows [row0, row0 + rows) of a [R, C] tensor (q, k, v of qkv; gate, up of fc)
  transposed,   // a [out, in] weight stored [in, out] (GPT-2's Conv1D)
  router_bias,  // sigmoid_bias's bias of a MoE layer: no parameter (Transformer::moe_biases)
};

struct HfEntry {
  std::string hf;     // Hugging Face's name
  std::string param;  // cleave's tensor; "" for router_bias
  HfLayout layout = HfLayout::same;
  std::vector<int64_t> param_shape;  // cleave's whole tensor; router_bias: [experts]
  int64_t row0 = 0, rows = 0;        // rows
  int layer = -1;                    // router_bias: its layer

  std::vector<int64_t> hf_shape() const;
  int64_t hf_numel() const;
  // Between cleave's whole tensor (param_shape, row-major) and Hugging Face's (hf_numel floats).
  void to_hf(const float* param, float* hf) const;
  void from_hf(const float* hf, float* param) const;
};

// Every Hugging Face tensor of a model of config c, in the order export writes them, each
// derived from the config alone; stops when `visit` returns false (import stops at the first
// tensor a folder lacks, so a config.json that asks for a huge model costs nothing).
void visit_hf_layout(const ModelConfig& c, const std::function<bool(const HfEntry&)>& visit);
std::vector<HfEntry> hf_layout(const ModelConfig& c);

bool is_mixtral(const ModelConfig& c);  // MixtralForCausalLM's layout

}  // namespace cleave
