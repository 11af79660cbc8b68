// A TOML config's keys as data: each key's type and allowed range or choices, and how it reads and
// writes one field of a struct. A table's keys can then live beside the struct they fill
// (model/model_keys.h: the [model] table) and a whole config compose them (train/config.cpp);
// whoever reads a table, the config or a checkpoint's copy of it, checks every value alike.
#pragma once
#include <charconv>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <toml++/toml.h>

#include "cleave/base/check.h"

namespace cleave {

enum class KeyKind { integer, real, boolean, string, string_list, integer_list };

template <class T>
struct ConfigKey {
  std::string name;  // dotted: "model.d_model"
  KeyKind kind;
  double min = 0, max = 0;
  std::vector<std::string> choices;
  // Values arrive checked against kind, range and choices (read_table).
  std::function<void(T&, const toml::node&)> set;
  // As a TOML literal; "" for a key that does not apply to this config (it is not written).
  std::function<std::string(const T&)> show;
};

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

template <class T, class V>
ConfigKey<T> integer_key(std::string name, V T::*field, double min, double max) {
  return {std::move(name), KeyKind::integer, min, max, {},
          [=](T& t, const toml::node& n) { t.*field = V(*n.value<int64_t>()); },
          [=](const T& t) { return std::to_string(t.*field); }};
}

template <class T, class V>
ConfigKey<T> real_key(std::string name, V T::*field, double min, double max) {
  return {std::move(name), KeyKind::real, min, max, {},
          [=](T& t, const toml::node& n) { t.*field = V(*n.value<double>()); },
          [=](const T& t) { return show_real(t.*field); }};
}

template <class T>
ConfigKey<T> bool_key(std::string name, bool T::*field) {
  return {std::move(name), KeyKind::boolean, 0, 0, {},
          [=](T& t, const toml::node& n) { t.*field = *n.value<bool>(); },
          [=](const T& t) { return std::string(t.*field ? "true" : "false"); }};
}

template <class T>
ConfigKey<T> string_key(std::string name, std::string T::*field) {
  return {std::move(name), KeyKind::string, 0, 0, {},
          [=](T& t, const toml::node& n) { t.*field = *n.value<std::string>(); },
          [=](const T& t) { return quote(t.*field); }};
}

// A string key that selects one of a fixed set of values of an enum.
template <class T, class E>
ConfigKey<T> choice_key(std::string name, E T::*field,
                        std::vector<std::pair<std::string, E>> options) {
  std::vector<std::string> choices;
  for (auto& [s, e] : options) choices.push_back(s);
  return {std::move(name), KeyKind::string, 0, 0, choices,
          [=](T& t, const toml::node& n) {
            const std::string v = *n.value<std::string>();
            for (auto& [s, e] : options)
              if (s == v) t.*field = e;
          },
          [=](const T& t) {
            for (auto& [s, e] : options)
              if (t.*field == e) return quote(s);
            return std::string("\"?\"");
          }};
}

// A key of the struct a member of Outer holds (a table's key in a config of several tables):
// `section` may be a class derived from the key's own.
template <class Outer, class Section, class T>
ConfigKey<Outer> nested_key(Section Outer::*section, ConfigKey<T> key) {
  static_assert(std::is_base_of_v<T, Section>);
  return {key.name, key.kind, key.min, key.max, key.choices,
          [section, set = key.set](Outer& o, const toml::node& n) { set(o.*section, n); },
          [section, show = key.show](const Outer& o) { return show(o.*section); }};
}

// Parses TOML text; a syntax error throws Error("ORIGIN:LINE: TOML syntax error: ...").
toml::table parse_toml(const std::string& text, const std::string& origin);

// "ORIGIN:LINE" of a node (ORIGIN alone when it has no line).
std::string toml_where(const toml::node& n, const std::string& origin);

// The name among `names` closest to `key` (by edit distance, also comparing the last components,
// so that a key placed in the wrong table is found by its own name).
std::string closest_key(const std::string& key, const std::vector<std::string>& names);

// Throws Error("WHERE: NAME must be ...") unless `n` has the kind and lies in [min, max] or among
// the choices (when there are any).
void check_value(KeyKind kind, double min, double max, const std::vector<std::string>& choices,
                 const toml::node& n, const std::string& name, const std::string& origin);

// Sets `out` from `table`, the document's table `table_name`, by the keys of `keys` named
// "table_name.<key>"; an unknown key is an error naming the closest of `keys`. Adds the names it
// set to `given`.
template <class T>
void read_table(const toml::table& table, const std::string& table_name,
                const std::vector<ConfigKey<T>>& keys, T& out, const std::string& origin,
                std::set<std::string>& given) {
  std::map<std::string, const ConfigKey<T>*> by_name;
  for (auto& k : keys) by_name[k.name] = &k;
  for (auto& [key_name, node] : table) {
    const std::string name = table_name + "." + std::string(key_name.str());
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::vector<std::string> names;
      for (auto& k : keys) names.push_back(k.name);
      throw Error(toml_where(node, origin) + ": unknown key '" + name + "' (did you mean '" +
                  closest_key(name, names) + "'?)");
    }
    const ConfigKey<T>& key = *it->second;
    check_value(key.kind, key.min, key.max, key.choices, node, name, origin);
    key.set(out, node);
    given.insert(name);
  }
}

}  // namespace cleave
