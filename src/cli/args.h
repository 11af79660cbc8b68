// The command line of a subcommand: positional arguments, --flag value options and repeated
// --set key=value overrides. Unknown options are errors that name them.
#pragma once
#include <climits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/base/check.h"

namespace cleave::cli {

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  std::vector<std::string> overrides;

  // `known` lists the options that take a value; `switches` those that do not.
  static Args parse(const std::string& command, int argc, char** argv,
                    const std::set<std::string>& known, const std::set<std::string>& switches = {}) {
    Args a;
    for (int i = 0; i < argc; ++i) {
      const std::string s = argv[i];
      if (s.rfind("--", 0) != 0) {
        a.positional.push_back(s);
        continue;
      }
      if (switches.count(s)) {
        a.options.insert_or_assign(s, std::string(1, '1'));  // not = "1": GCC 12 warns falsely (-Wrestrict)
        continue;
      }
      if (s != "--set" && !known.count(s)) throw Error("cleave " + command + ": unknown option " + s);
      if (i + 1 >= argc) throw Error("cleave " + command + ": " + s + " needs a value");
      if (s == "--set") a.overrides.push_back(argv[++i]);
      else a.options[s] = argv[++i];
    }
    return a;
  }
  bool has(const std::string& k) const { return options.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def) const {
    auto it = options.find(k);
    return it == options.end() ? def : it->second;
  }
  double number(const std::string& k, double def) const;
  // A finite number in [lo, hi] (nan and infinities are none), or an error naming the option.
  double number_in(const std::string& k, double def, double lo, double hi) const;
  // A whole-string integer in [lo, hi], or an error naming the option and the text.
  int64_t integer(const std::string& k, int64_t def, int64_t lo, int64_t hi) const;
};

// A whole-string integer in [lo, hi], or an error naming `what` (an option or a key) and the text.
inline int64_t parse_integer(const std::string& text, const std::string& what, int64_t lo,
                             int64_t hi) {
  int64_t v = 0;
  try {
    size_t used = 0;
    v = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument("trailing text");
  } catch (const std::exception&) {
    throw Error(what + " expects an integer, got '" + text + "'");
  }
  if (v < lo || v > hi)
    throw Error(what + " = " + text + (hi == INT64_MAX ? " is below " + std::to_string(lo)
                                       : " is out of range [" + std::to_string(lo) + ", " +
                                             std::to_string(hi) + "]"));
  return v;
}

// A whole-string number, or an error naming `what` (an option or a key) and the text.
inline double parse_number(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(what + " expects a number, got '" + text + "'");
}

// A finite number in [lo, hi] (nan and infinities are none), or an error naming `what`.
inline double parse_number_in(const std::string& text, const std::string& what, double lo, double hi) {
  const double v = parse_number(text, what);
  if (!(v >= lo && v <= hi)) {  // false for nan
    std::ostringstream range;
    range << "[" << lo << ", " << hi << "]";
    throw Error(what + " = " + text + " is out of range " + range.str());
  }
  return v;
}

inline double Args::number(const std::string& k, double def) const {
  auto it = options.find(k);
  return it == options.end() ? def : parse_number(it->second, k);
}

inline double Args::number_in(const std::string& k, double def, double lo, double hi) const {
  auto it = options.find(k);
  return it == options.end() ? def : parse_number_in(it->second, k, lo, hi);
}

inline int64_t Args::integer(const std::string& k, int64_t def, int64_t lo, int64_t hi) const {
  auto it = options.find(k);
  return it == options.end() ? def : parse_integer(it->second, k, lo, hi);
}

}  // namespace cleave::cli
