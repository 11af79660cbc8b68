#include "cleave/base/toml_keys.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>

namespace cleave {

namespace {

const char* kind_name(KeyKind k) {
  switch (k) {
    case KeyKind::integer: return "an integer";
    case KeyKind::real: return "a number";
    case KeyKind::boolean: return "a boolean";
    case KeyKind::string: return "a string";
    case KeyKind::string_list: return "an array of strings";
    case KeyKind::integer_list: return "an array of integers";
  }
  return "?";
}

// A bound in a message: short, not round-trip exact.
std::string show_bound(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  os << n.type() << " ";
  if (n.is_table()) os << "{...}";
  else if (n.is_array()) os << *n.as_array();
  // Floats as written ("0.9"), not as toml++ prints them (0.90000000000000002).
  else if (n.is_floating_point()) os << show_real(*n.value<double>());
  else n.visit([&](auto&& v) { os << v; });
  return os.str();
}

bool type_matches(KeyKind kind, const toml::node& n) {
  switch (kind) {
    case KeyKind::integer: return n.is_integer();
    case KeyKind::real: return n.is_floating_point() || n.is_integer();
    case KeyKind::boolean: return n.is_boolean();
    case KeyKind::string: return n.is_string();
    case KeyKind::string_list: {
      if (!n.is_array()) return false;
      for (auto& e : *n.as_array())
        if (!e.is_string()) return false;
      return true;
    }
    case KeyKind::integer_list: {
      if (!n.is_array()) return false;
      for (auto& e : *n.as_array())
        if (!e.is_integer()) return false;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += char(ch);
    else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else out += char(ch);
  }
  return out + "\"";
}

toml::table parse_toml(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ": TOML syntax error: " << e.description();
    throw Error(os.str());
  }
}

std::string toml_where(const toml::node& n, const std::string& origin) {
  const auto& src = n.source();
  return src.begin.line ? origin + ":" + std::to_string(src.begin.line) : origin;
}

std::string closest_key(const std::string& key, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  const std::string leaf = key.substr(key.rfind('.') + 1);
  for (const std::string& name : names) {
    const std::string name_leaf = name.substr(name.find('.') + 1);
    const size_t d = std::min(edit_distance(key, name), edit_distance(leaf, name_leaf) + 1);
    if (d < best_d) best_d = d, best = name;
  }
  return best;
}

void check_value(KeyKind kind, double min, double max, const std::vector<std::string>& choices,
                 const toml::node& n, const std::string& name, const std::string& origin) {
  if (!type_matches(kind, n))
    throw Error(toml_where(n, origin) + ": " + name + " must be " + kind_name(kind) + ", got " +
                describe(n));
  if (kind == KeyKind::integer || kind == KeyKind::real) {
    const double v = n.is_integer() ? double(*n.value<int64_t>()) : *n.value<double>();
    if (!(v >= min && v <= max))
      throw Error(toml_where(n, origin) + ": " + name + " = " +
                  describe(n).substr(describe(n).find(' ') + 1) + " is out of range [" +
                  show_bound(min) + ", " + show_bound(max) + "]");
  }
  // Each element of an integer array in its range too: [4294967298] must not become [2].
  if (kind == KeyKind::integer_list)
    for (size_t i = 0; i < n.as_array()->size(); ++i) {
      const int64_t v = *(*n.as_array())[i].value<int64_t>();
      if (double(v) < min || double(v) > max)
        throw Error(toml_where(n, origin) + ": " + name + "[" + std::to_string(i) + "] = " +
                    std::to_string(v) + " is out of range [" + show_bound(min) + ", " +
                    show_bound(max) + "]");
    }
  if (!choices.empty()) {
    const std::string v = *n.value<std::string>();
    if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
      std::string list;
      for (auto& ch : choices) list += (list.empty() ? "" : ", ") + quote(ch);
      throw Error(toml_where(n, origin) + ": " + name + " = " + quote(v) + " is not one of " + list);
    }
  }
}

}  // namespace cleave
