// The model's tensors under Hugging Face names and layouts, by the one table of both directions
// (model/hf_layout.h), and its config.json (model/hf_config.h). Works on any flat buffer laid out
// like the parameters, so gradients map the same way as values.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cleave/model/hf_config.h"
#include "cleave/model/hf_layout.h"
#include "cleave/model/params.h"

namespace cleave {

struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// The start, in `flat` (laid out like the store's parameters), of the cleave tensor entry e reads
// (not a router_bias), checked to exist with the table's shape.
const float* hf_source(const ParamStore& store, const HfEntry& e, const float* flat);

// router_bias: sigmoid_bias's bias per MoE layer (by layer; Transformer::moe_biases); a layer
// without one writes none (gradients have none).
std::vector<HfTensor> hf_tensors(const ParamStore& store, const ModelConfig& cfg, const float* flat,
                                 const std::map<int, std::vector<float>>& router_bias = {});

}  // namespace cleave
