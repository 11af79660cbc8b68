// The config's [model] table: its keys and the rules between them. train/config.cpp composes them
// into the whole config; a checkpoint's copy of the table is read with them too
// (checkpoint/load_model.h), so a model comes back from a checkpoint without the trainer.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "cleave/base/toml_keys.h"
#include "cleave/model/model_config.h"

namespace cleave {

// Every key of [model], in the order the config writes them ("model.d_model", ...).
const std::vector<ConfigKey<ModelConfig>>& model_keys();

// Resolves the family defaults of the keys not in `given` (n_kv_heads, tie_embeddings,
// ffn_hidden, moe_ffn_hidden), then checks the rules between the model's keys; a broken rule
// throws Error("ORIGIN: message").
void resolve_model_config(ModelConfig& m, const std::set<std::string>& given,
                          const std::string& origin);

// The [model] table of a TOML document, checked and resolved as above.
ModelConfig read_model_config(const toml::table& root, const std::string& origin);

}  // namespace cleave
