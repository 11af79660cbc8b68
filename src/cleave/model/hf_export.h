// The model's tensors under Hugging Face names and layouts (GPT2LMHeadModel or LlamaForCausalLM)
// and the matching config.json. GPT-2 stores its linear weights as Conv1D, [in, out]; Llama keeps
// q, k, v and gate, up as separate tensors. Works on any flat buffer laid out like the parameters,
// so gradients map the same way as values.
#pragma once
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

std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& cfg, const float* flat);
nlohmann::json hf_config(const ModelConfig& cfg);

}  // namespace cleave
