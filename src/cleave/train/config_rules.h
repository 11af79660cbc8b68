// The config's rules between keys (config.cpp checks each key alone against the schema): the
// defaults that follow from other keys, and the combinations that are errors, each naming every
// key involved ([model]'s own are model/model_keys.h's). Also the fp8 predicates the schema
// shares with the rules. Internal to train/config*.cpp.
#pragma once
#include <set>
#include <string>

#include "cleave/train/config.h"

namespace cleave::config_rules {

bool is_fp8(const Config& c);
bool per_tensor_fp8(const Config& c);  // fp8 with the delayed or current recipe
bool delayed_fp8(const Config& c);

// Resolves the defaults of the keys not in `given` that follow from others, then checks the
// rules between keys, [model]'s first; a broken rule throws Error("ORIGIN: message").
void validate_and_resolve(Config& c, const std::set<std::string>& given, const std::string& origin);

}  // namespace cleave::config_rules
