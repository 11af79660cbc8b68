// A Hugging Face config.json and cleave's [model] table, both ways: per architecture one table of
// keys (config.json's name, cleave's key, Hugging Face's default) that export writes and import
// reads, and the values cleave's model fixes (GPT-2's gelu_new, Llama's silu, no biases, no
// sliding window), which export writes and import refuses to change.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "cleave/model/model_config.h"

namespace cleave {

// config.json of cleave's model: GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM
// (is_mixtral) or CleaveMoeForCausalLM (any other mixture of experts: the family's keys and
// cleave's moe_* keys).
nlohmann::json hf_config(const ModelConfig& cfg);

// The model a config.json describes, checked by [model]'s ranges and rules. An error names
// `origin` (the file) and the key at fault: an architecture or model_type cleave does not read, a
// missing or out-of-range key, or a feature cleave's model lacks (rope_scaling, a sliding
// window, attention biases, another activation).
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& origin);

}  // namespace cleave
