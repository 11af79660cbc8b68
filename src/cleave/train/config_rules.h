// The config's rules between keys (config.cpp checks each key alone against the schema): the
// defaults that follow from other keys, and the combinations that are errors, each naming every
// key involved. Also the value printers and fp8 predicates the schema shares with the rules.
// Internal to train/config*.cpp.
#pragma once
#include <charconv>
#include <set>
#include <string>

#include "cleave/train/config.h"

namespace cleave::config_rules {

// A TOML basic string: double quotes, with backslash, quote and control characters escaped.
std::string quote(const std::string& s);

// The shortest text that reads back as the same value of its type (float fields print as floats),
// always a TOML float ("0.9", "1e-05").
template <class Real>
std::string show_real(Real v) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "n": inf and nan
  return s;
}

bool is_fp8(const Config& c);
bool per_tensor_fp8(const Config& c);  // fp8 with the delayed or current recipe
bool delayed_fp8(const Config& c);

// Resolves the defaults of the keys not in `given` that follow from others, then checks the
// rules between keys; a broken rule throws Error("ORIGIN: message").
void validate_and_resolve(Config& c, const std::set<std::string>& given, const std::string& origin);

}  // namespace cleave::config_rules
