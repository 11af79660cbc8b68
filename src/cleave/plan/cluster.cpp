#include "cleave/plan/cluster.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "cleave/base/file.h"
#include "cleave/base/toml_keys.h"

namespace cleave {

namespace {

constexpr int64_t kMaxClusterBytes = 16 * kMiB;
constexpr double kMaxGemmDim = double(int64_t(1) << 30);
constexpr double kMaxRate = 1e12;  // GF/s or GB/s: far above any device

const char* kUnknown = "unknown";

// An error at `node` (its line) for the key `name`.
[[noreturn]] void fail_at(const toml::node& node, const std::string& origin,
                          const std::string& message) {
  throw Error(toml_where(node, origin) + ": " + message);
}

// Refuses a key of `table` (named prefix + "." + key) that is not among `allowed`, naming the
// closest allowed one.
void refuse_unknown_keys(const toml::table& table, const std::string& prefix,
                         const std::vector<std::string>& allowed, const std::string& origin) {
  for (auto& [key, node] : table) {
    const std::string k(key.str());
    if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
    std::vector<std::string> names;
    for (auto& a : allowed) names.push_back(prefix.empty() ? a : prefix + "." + a);
    const std::string name = prefix.empty() ? k : prefix + "." + k;
    fail_at(node, origin,
            "unknown key '" + name + "' (did you mean '" + closest_key(name, names) + "'?)");
  }
}

// The node of a key that must be there; `where` locates the table holding it.
const toml::node& required(const toml::table& table, const std::string& key,
                           const std::string& name, const std::string& where) {
  const toml::node* n = table.get(key);
  if (!n) throw Error(where + ": " + name + " is missing");
  return *n;
}

const toml::table& table_of(const toml::node& n, const std::string& name,
                            const std::string& origin) {
  if (!n.is_table()) fail_at(n, origin, name + " must be a table");
  return *n.as_table();
}

double real_of(const toml::node& n, const std::string& name, double min, double max,
               const std::string& origin) {
  check_value(KeyKind::real, min, max, {}, n, name, origin);
  return n.is_integer() ? double(*n.value<int64_t>()) : *n.value<double>();
}

std::vector<std::string> dtype_names() {
  std::vector<std::string> names;
  for (Precision p : kClusterDtypes) names.push_back(precision_name(p));
  return names;
}

std::vector<std::string> link_names() {
  std::vector<std::string> names;
  for (LinkClass l : kLinkClasses) names.push_back(link_class_name(l));
  return names;
}

std::vector<std::string> collective_names() {
  std::vector<std::string> names;
  for (Collective c : kCollectives) names.push_back(collective_name(c));
  return names;
}

// The measured rates a file may leave out (Cluster says what stands in for them).
const std::array<std::pair<const char*, double Cluster::*>, 5> kOptionalRates = {{
    {"cluster.elementwise_gbps", &Cluster::elementwise_gbps},
    {"cluster.fp8_gbps", &Cluster::fp8_gbps},
    {"cluster.pack_gbps", &Cluster::pack_gbps},
    {"cluster.refault_gbps", &Cluster::refault_gbps},
    {"cluster.refault_huge_gbps", &Cluster::refault_huge_gbps},
}};

constexpr const char* kImbalanceKey = "cluster.compute_imbalance";

bool optional_key(const std::string& name) {
  if (name == kImbalanceKey) return true;
  for (const auto& [key, rate] : kOptionalRates)
    if (name == key) return true;
  return false;
}

const std::vector<ConfigKey<Cluster>>& cluster_keys() {
  static const std::vector<ConfigKey<Cluster>> keys = [] {
    using C = Cluster;
    std::vector<ConfigKey<C>> k;
    k.push_back(string_key("cluster.name", &C::name));
    k.push_back(string_key("cluster.source", &C::source));
    k.push_back(integer_key("cluster.devices_per_host", &C::devices_per_host, 1, 1 << 20));
    k.push_back(real_key("cluster.memory_gib", &C::memory_gib, 1e-6, 1e9));
    k.push_back(real_key("cluster.memory_gbps", &C::memory_gbps, 1e-6, kMaxRate));
    for (const auto& [name, rate] : kOptionalRates) {
      ConfigKey<C> key = real_key(name, rate, 1e-6, kMaxRate);
      key.show = [field = rate](const C& c) { return c.*field > 0 ? show_real(c.*field) : ""; };
      k.push_back(key);
    }
    ConfigKey<C> imbalance = real_key(kImbalanceKey, &C::compute_imbalance, 1, 100);
    imbalance.show = [](const C& c) {
      return c.compute_imbalance > 0 ? show_real(c.compute_imbalance) : "";
    };
    k.push_back(imbalance);
    std::vector<std::pair<std::string, Precision>> dtypes;
    for (Precision p : kClusterDtypes) dtypes.push_back({precision_name(p), p});
    k.push_back(choice_key("cluster.attention_dtype", &C::attention_dtype, dtypes));
    return k;
  }();
  return keys;
}

void read_peaks(const toml::table& t, const std::string& where, Cluster& c,
                const std::string& origin) {
  refuse_unknown_keys(t, "peak_gflops", dtype_names(), origin);
  for (Precision p : kClusterDtypes) {
    const std::string name = std::string("peak_gflops.") + precision_name(p);
    const toml::node& n = required(t, precision_name(p), name, where);
    if (n.is_string()) {
      if (*n.value<std::string>() != kUnknown)
        fail_at(n, origin, name + " = " + quote(*n.value<std::string>()) +
                               " must be a number (GF/s) or \"unknown\"");
      continue;
    }
    c.peak_gflops[p] = real_of(n, name, 1e-6, kMaxRate, origin);
  }
}

GemmTable read_gemm_table(const toml::node& node, const std::string& name,
                          const std::string& origin) {
  if (!node.is_array()) fail_at(node, origin, name + " must be an array of {m, n, k, gflops}");
  const toml::array& entries = *node.as_array();
  if (entries.empty()) fail_at(node, origin, name + " has no points");
  std::vector<GemmPoint> points;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry = name + "[" + std::to_string(i) + "]";
    const toml::table& e = table_of(entries[i], entry, origin);
    const std::string where = toml_where(entries[i], origin);
    refuse_unknown_keys(e, entry, {"m", "n", "k", "gflops"}, origin);
    GemmPoint p;
    int64_t* dims[] = {&p.m, &p.n, &p.k};
    const char* dim_names[] = {"m", "n", "k"};
    for (int d = 0; d < 3; ++d) {
      const toml::node& v = required(e, dim_names[d], entry + "." + dim_names[d], where);
      check_value(KeyKind::integer, 1, kMaxGemmDim, {}, v, entry + "." + dim_names[d], origin);
      *dims[d] = *v.value<int64_t>();
    }
    p.gflops = real_of(required(e, "gflops", entry + ".gflops", where), entry + ".gflops", 1e-9,
                       kMaxRate, origin);
    points.push_back(p);
  }
  return GemmTable(std::move(points), toml_where(node, origin) + ": " + name);
}

std::vector<AttentionRate> read_attention_rates(const toml::node& node, const std::string& origin) {
  const toml::table& t = table_of(node, "attention", origin);
  refuse_unknown_keys(t, "attention", {"rates"}, origin);
  const toml::node& rates = required(t, "rates", "attention.rates", toml_where(node, origin));
  if (!rates.is_array()) fail_at(rates, origin, "attention.rates must be an array of {keys, gflops}");
  const toml::array& entries = *rates.as_array();
  if (entries.empty()) fail_at(rates, origin, "attention.rates has no points");
  std::vector<AttentionRate> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string entry = "attention.rates[" + std::to_string(i) + "]";
    const toml::table& e = table_of(entries[i], entry, origin);
    const std::string where = toml_where(entries[i], origin);
    refuse_unknown_keys(e, entry, {"keys", "gflops"}, origin);
    AttentionRate r;
    const toml::node& keys = required(e, "keys", entry + ".keys", where);
    check_value(KeyKind::integer, 1, kMaxGemmDim, {}, keys, entry + ".keys", origin);
    r.keys = *keys.value<int64_t>();
    r.gflops = real_of(required(e, "gflops", entry + ".gflops", where), entry + ".gflops", 1e-9,
                       kMaxRate, origin);
    if (!out.empty() && r.keys <= out.back().keys)
      fail_at(entries[i], origin, entry + ".keys = " + std::to_string(r.keys) +
                                      " must be larger than the point before it (" +
                                      std::to_string(out.back().keys) + ")");
    out.push_back(r);
  }
  return out;
}

AlphaBeta read_line(const toml::node& n, const std::string& name, bool first,
                    const std::string& origin) {
  const toml::table& t = table_of(n, name, origin);
  const std::string at = toml_where(n, origin);
  if (first && t.get("from_bytes"))
    fail_at(*t.get("from_bytes"), origin, name + ".from_bytes: the first line applies from 0 "
                                                 "bytes on and takes no from_bytes");
  refuse_unknown_keys(t, name, {"from_bytes", "alpha_us", "beta_gbps"}, origin);
  AlphaBeta line;
  line.alpha_us =
      real_of(required(t, "alpha_us", name + ".alpha_us", at), name + ".alpha_us", 0, 1e9, origin);
  line.beta_gbps = real_of(required(t, "beta_gbps", name + ".beta_gbps", at), name + ".beta_gbps",
                           1e-9, kMaxRate, origin);
  if (!first) {
    const toml::node& from = required(t, "from_bytes", name + ".from_bytes", at);
    check_value(KeyKind::integer, 1, double(int64_t(1) << 50), {}, from, name + ".from_bytes",
                origin);
    line.from_bytes = *from.value<int64_t>();
  }
  return line;
}

// A collective's cost: one line as a table, or lines as an array of tables, the first without
// from_bytes and the others from ascending sizes.
CollectiveCost read_cost(const toml::node& n, const std::string& name, const std::string& origin) {
  if (!n.is_array()) return {read_line(n, name, true, origin)};
  const toml::array& lines = *n.as_array();
  if (lines.empty()) fail_at(n, origin, name + " has no lines");
  CollectiveCost cost;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string line = name + "[" + std::to_string(i) + "]";
    cost.push_back(read_line(lines[i], line, i == 0, origin));
    if (i > 0 && cost[i].from_bytes <= cost[i - 1].from_bytes)
      fail_at(lines[i], origin, line + ".from_bytes = " + std::to_string(cost[i].from_bytes) +
                                    " must exceed the line before's");
  }
  return cost;
}

LinkCosts read_link(const toml::table& t, const std::string& prefix, const std::string& where,
                    const std::string& origin, double& slowdown) {
  std::vector<std::string> keys = collective_names();
  keys.push_back("compute_slowdown");
  refuse_unknown_keys(t, prefix, keys, origin);
  slowdown = real_of(required(t, "compute_slowdown", prefix + ".compute_slowdown", where),
                     prefix + ".compute_slowdown", 0, 100, origin);
  LinkCosts costs;
  for (Collective kind : kCollectives) {
    const std::string name = prefix + "." + collective_name(kind);
    costs[size_t(kind)] = read_cost(required(t, collective_name(kind), name, where), name, origin);
  }
  return costs;
}

std::string show_line(const AlphaBeta& line) {
  return std::string("{ ") +
         (line.from_bytes ? "from_bytes = " + std::to_string(line.from_bytes) + ", " : "") +
         "alpha_us = " + show_real(line.alpha_us) + ", beta_gbps = " + show_real(line.beta_gbps) +
         " }";
}

double line_seconds(const AlphaBeta& line, Collective kind, double bytes, int ranks) {
  return line.alpha_us * 1e-6 * ring_steps(kind, ranks) +
         ring_bytes_sent(kind, bytes, ranks) / (line.beta_gbps * 1e9);
}

double cost_seconds(const CollectiveCost& cost, Collective kind, double bytes, int ranks) {
  double seconds = 0;
  for (const AlphaBeta& line : cost)
    if (double(line.from_bytes) <= bytes)
      seconds = std::max(seconds, line_seconds(line, kind, bytes, ranks));
  return seconds;
}

std::string show_dims(int64_t m, int64_t n, int64_t k) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
}

}  // namespace

const char* link_class_name(LinkClass l) {
  return l == LinkClass::intra_host ? "intra_host" : "inter_host";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_to_all: return "all_to_all";
    case Collective::send_recv: return "send_recv";
  }
  return "?";
}

GemmTable::GemmTable(std::vector<GemmPoint> points, const std::string& where)
    : points_(std::move(points)) {
  if (points_.empty()) throw Error(where + ": no points");
  std::array<std::vector<int64_t>, 3> axes;
  for (const GemmPoint& p : points_) {
    if (p.m < 1 || p.n < 1 || p.k < 1 || !(p.gflops > 0))
      throw Error(where + ": " + show_dims(p.m, p.n, p.k) + " at " + show_real(p.gflops) +
                  " GF/s: dimensions and rate must be positive");
    axes[0].push_back(p.m), axes[1].push_back(p.n), axes[2].push_back(p.k);
  }
  for (auto& a : axes) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  // A full grid before anything of its size is allocated: points that are no grid could
  // otherwise stand for a vast one.
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;
  for (const GemmPoint& p : points_)
    if (!shapes.insert({p.m, p.n, p.k}).second)
      throw Error(where + ": " + show_dims(p.m, p.n, p.k) + " is listed twice");
  const size_t nm = axes[0].size(), nn = axes[1].size(), nk = axes[2].size();
  if (double(nm) * double(nn) * double(nk) != double(points_.size()))
    for (int64_t m : axes[0])  // the first shape missing comes within points_.size() + 1 tries
      for (int64_t n : axes[1])
        for (int64_t k : axes[2])
          if (!shapes.count({m, n, k}))
            throw Error(where + ": the shapes are no full grid: " + show_dims(m, n, k) +
                        " is missing (each m listed must appear with every n and every k)");
  auto index = [&](int d, int64_t v) {
    return size_t(std::lower_bound(axes[d].begin(), axes[d].end(), v) - axes[d].begin());
  };
  std::vector<double> log_s(nm * nn * nk);
  for (const GemmPoint& p : points_)
    log_s[(index(0, p.m) * nn + index(1, p.n)) * nk + index(2, p.k)] =
        std::log(2.0 * double(p.m) * double(p.n) * double(p.k) / (p.gflops * 1e9));
  // The envelope: a running maximum along each axis makes every point's time the largest of the
  // points it dominates.
  for (size_t i = 0; i < nm; ++i)
    for (size_t j = 0; j < nn; ++j)
      for (size_t l = 0; l < nk; ++l) {
        double& cell = log_s[(i * nn + j) * nk + l];
        if (i) cell = std::max(cell, log_s[((i - 1) * nn + j) * nk + l]);
        if (j) cell = std::max(cell, log_s[(i * nn + j - 1) * nk + l]);
        if (l) cell = std::max(cell, log_s[(i * nn + j) * nk + l - 1]);
      }
  log_seconds_ = std::move(log_s);
  for (int d = 0; d < 3; ++d)
    for (int64_t v : axes[d]) log_axis_[d].push_back(std::log(double(v)));
}

double GemmTable::seconds(int64_t m, int64_t n, int64_t k, double peak_gflops) const {
  CLEAVE_CHECK(!log_seconds_.empty(), "a GEMM table without points");
  CLEAVE_CHECK(m >= 0 && n >= 0 && k >= 0, "a product of " << show_dims(m, n, k));
  if (m == 0 || n == 0 || k == 0) return 0;
  const double x[3] = {std::log(double(m)), std::log(double(n)), std::log(double(k))};
  size_t lo[3];
  double t[3];
  double log_time = 0;  // beyond the grid: the clamped point's time scaled by the FLOPs
  for (int d = 0; d < 3; ++d) {
    const std::vector<double>& a = log_axis_[d];
    const double c = std::clamp(x[d], a.front(), a.back());
    log_time += x[d] - c;
    lo[d] = a.size() == 1 ? 0
                          : std::min(size_t(std::upper_bound(a.begin(), a.end(), c) - a.begin()),
                                     a.size() - 1) - 1;
    t[d] = a.size() == 1 ? 0 : (c - a[lo[d]]) / (a[lo[d] + 1] - a[lo[d]]);
  }
  const size_t nn = log_axis_[1].size(), nk = log_axis_[2].size();
  for (int corner = 0; corner < 8; ++corner) {
    double w = 1;
    size_t at[3];
    for (int d = 0; d < 3; ++d) {
      const bool up = (corner >> d) & 1;
      w *= up ? t[d] : 1 - t[d];
      at[d] = lo[d] + (up && t[d] > 0 ? 1 : 0);
    }
    if (w > 0) log_time += w * log_seconds_[(at[0] * nn + at[1]) * nk + at[2]];
  }
  const double seconds = std::exp(log_time);
  if (peak_gflops <= 0) return seconds;
  return std::max(seconds, 2.0 * double(m) * double(n) * double(k) / (peak_gflops * 1e9));
}

Cluster parse_cluster(const std::string& text, const std::string& origin) {
  const toml::table root = parse_toml(text, origin);
  refuse_unknown_keys(root, "", {"cluster", "peak_gflops", "gemm", "attention", "collectives"},
                     origin);
  Cluster c;
  std::set<std::string> given;
  const toml::table& cluster = table_of(required(root, "cluster", "[cluster]", origin), "cluster", origin);
  read_table(cluster, "cluster", cluster_keys(), c, origin, given);
  for (auto& k : cluster_keys())
    if (!given.count(k.name) && !optional_key(k.name))
      throw Error(toml_where(cluster, origin) + ": " + k.name + " is missing");
  if (c.name.empty()) fail_at(*cluster.get("name"), origin, "cluster.name is empty");

  const toml::node& peaks = required(root, "peak_gflops", "[peak_gflops]", origin);
  read_peaks(table_of(peaks, "peak_gflops", origin), toml_where(peaks, origin), c, origin);

  if (const toml::node* gemm = root.get("gemm")) {
    const toml::table& t = table_of(*gemm, "gemm", origin);
    refuse_unknown_keys(t, "gemm", dtype_names(), origin);
    for (Precision p : kClusterDtypes)
      if (const toml::node* n = t.get(precision_name(p)))
        c.gemm[p] = read_gemm_table(*n, std::string("gemm.") + precision_name(p), origin);
  }

  if (const toml::node* attention = root.get("attention"))
    c.attention = read_attention_rates(*attention, origin);

  if (const toml::node* coll = root.get("collectives")) {
    const toml::table& t = table_of(*coll, "collectives", origin);
    refuse_unknown_keys(t, "collectives", link_names(), origin);
    for (LinkClass l : kLinkClasses)
      if (const toml::node* n = t.get(link_class_name(l))) {
        const std::string prefix = std::string("collectives.") + link_class_name(l);
        c.links[size_t(l)] = read_link(table_of(*n, prefix, origin), prefix,
                                       toml_where(*n, origin), origin, c.compute_slowdown[size_t(l)]);
      }
  }
  return c;
}

Cluster read_cluster(const std::string& path) {
  return parse_cluster(read_bounded_file(path, "cluster file", kMaxClusterBytes), path);
}

std::string cluster_toml(const Cluster& c, const std::map<std::string, std::string>& comments) {
  std::set<std::string> used;
  std::string out;
  auto comment = [&](const std::string& key) {
    auto it = comments.find(key);
    if (it == comments.end()) return;
    used.insert(key);
    std::istringstream lines(it->second);
    for (std::string line; std::getline(lines, line);) out += line.empty() ? "#\n" : "# " + line + "\n";
  };
  comment("");
  comment("cluster");
  out += "[cluster]\n";
  for (auto& k : cluster_keys()) {
    const std::string value = k.show(c);
    if (value.empty()) continue;
    comment(k.name);
    out += k.name.substr(k.name.find('.') + 1) + " = " + value + "\n";
  }
  out += "\n";
  comment("peak_gflops");
  out += "[peak_gflops]\n";
  for (Precision p : kClusterDtypes) {
    const std::string name = precision_name(p);
    comment("peak_gflops." + name);
    auto it = c.peak_gflops.find(p);
    out += name + " = " + (it == c.peak_gflops.end() ? quote(kUnknown) : show_real(it->second)) + "\n";
  }
  if (!c.gemm.empty() || comments.count("gemm")) {
    out += "\n";
    comment("gemm");
    out += "[gemm]\n";
    for (Precision p : kClusterDtypes) {
      const std::string name = precision_name(p);
      comment("gemm." + name);
      auto it = c.gemm.find(p);
      if (it == c.gemm.end()) continue;
      out += name + " = [\n";
      for (const GemmPoint& g : it->second.points())
        out += "  { m = " + std::to_string(g.m) + ", n = " + std::to_string(g.n) +
               ", k = " + std::to_string(g.k) + ", gflops = " + show_real(g.gflops) + " },\n";
      out += "]\n";
    }
  }
  if (!c.attention.empty()) {
    out += "\n";
    comment("attention");
    out += "[attention]\nrates = [\n";
    for (const AttentionRate& r : c.attention)
      out += "  { keys = " + std::to_string(r.keys) + ", gflops = " + show_real(r.gflops) + " },\n";
    out += "]\n";
  }
  for (LinkClass l : kLinkClasses) {
    const std::string prefix = std::string("collectives.") + link_class_name(l);
    const auto& costs = c.links[size_t(l)];
    if (!costs && !comments.count(prefix)) continue;
    out += "\n";
    comment(prefix);
    if (!costs) continue;
    out += "[" + prefix + "]\n";
    comment(prefix + ".compute_slowdown");
    out += "compute_slowdown = " + show_real(c.compute_slowdown[size_t(l)]) + "\n";
    for (Collective kind : kCollectives) {
      const CollectiveCost& cost = (*costs)[size_t(kind)];
      CLEAVE_CHECK(!cost.empty(), prefix << "." << collective_name(kind) << " has no lines");
      comment(prefix + "." + collective_name(kind));
      out += std::string(collective_name(kind)) + " = ";
      if (cost.size() == 1) {
        out += show_line(cost[0]) + "\n";
        continue;
      }
      out += "[\n";
      for (const AlphaBeta& line : cost) out += "  " + show_line(line) + ",\n";
      out += "]\n";
    }
  }
  for (auto& [key, text] : comments)
    CLEAVE_CHECK(used.count(key), "a comment for '" << key << "', which the cluster file has not");
  return out;
}

double gemm_seconds(const Cluster& c, int64_t m, int64_t n, int64_t k, Precision p) {
  auto it = c.gemm.find(p);
  if (it == c.gemm.end())
    throw Error("cluster '" + c.name + "' has no " + precision_name(p) + " GEMM table (gemm." +
                precision_name(p) + ")");
  auto peak = c.peak_gflops.find(p);
  return it->second.seconds(m, n, k, peak == c.peak_gflops.end() ? 0.0 : peak->second);
}

int ring_steps(Collective kind, int ranks) {
  CLEAVE_CHECK(ranks >= 1, "a collective over " << ranks << " ranks");
  switch (kind) {
    case Collective::all_reduce: return 2 * (ranks - 1);
    case Collective::send_recv: return ranks > 1 ? 1 : 0;
    default: return ranks - 1;
  }
}

double ring_bytes_sent(Collective kind, double bytes, int ranks) {
  CLEAVE_CHECK(ranks >= 1, "a collective over " << ranks << " ranks");
  const double p = ranks;
  switch (kind) {
    case Collective::all_reduce: return 2 * (p - 1) / p * bytes;
    case Collective::send_recv: return ranks > 1 ? bytes : 0;
    default: return (p - 1) / p * bytes;
  }
}

double collective_seconds(const Cluster& c, Collective kind, LinkClass link, double bytes,
                          int ranks) {
  const auto& costs = c.links[size_t(link)];
  if (!costs)
    throw Error("cluster '" + c.name + "' does not describe its " + link_class_name(link) +
                " links (collectives." + link_class_name(link) + ")");
  if (ranks <= 1 || bytes <= 0) return 0;
  return cost_seconds((*costs)[size_t(kind)], kind, bytes, ranks);
}

double memory_seconds(const Cluster& c, double bytes) {
  CLEAVE_CHECK(c.memory_gbps > 0, "cluster '" << c.name << "' has no memory bandwidth");
  return bytes / (c.memory_gbps * 1e9);
}

double elementwise_seconds(const Cluster& c, double bytes) {
  return c.elementwise_gbps > 0 ? bytes / (c.elementwise_gbps * 1e9) : memory_seconds(c, bytes);
}

double fp8_seconds(const Cluster& c, double bytes) {
  return c.fp8_gbps > 0 ? bytes / (c.fp8_gbps * 1e9) : elementwise_seconds(c, bytes);
}

double pack_seconds(const Cluster& c, double bytes) {
  return c.pack_gbps > 0 ? bytes / (c.pack_gbps * 1e9) : 0.0;
}

double refault_seconds(const Cluster& c, double bytes, bool huge_pages) {
  const double gbps = huge_pages ? c.refault_huge_gbps : c.refault_gbps;
  return gbps > 0 ? bytes / (gbps * 1e9) : 0.0;
}

double compute_imbalance_on(const Cluster& c, int world) {
  return world > 1 && c.compute_imbalance > 0 ? c.compute_imbalance : 1.0;
}

double attention_seconds(const Cluster& c, int64_t m, int64_t n, int64_t k) {
  if (c.attention.empty()) return gemm_seconds(c, m, n, k, c.attention_dtype);
  CLEAVE_CHECK(m >= 0 && n >= 0 && k >= 0, "attention of " << show_dims(m, n, k));
  if (m == 0 || n == 0 || k == 0) return 0;
  const std::vector<AttentionRate>& r = c.attention;
  double gflops = r.front().gflops;
  if (n >= r.back().keys) {
    gflops = r.back().gflops;
  } else if (n > r.front().keys) {
    const size_t hi = size_t(std::upper_bound(r.begin(), r.end(), n, [](int64_t keys,
                                                                        const AttentionRate& p) {
                               return keys < p.keys;
                             }) - r.begin());
    const AttentionRate& a = r[hi - 1];
    const AttentionRate& b = r[hi];
    const double t = std::log(double(n) / double(a.keys)) / std::log(double(b.keys) / double(a.keys));
    gflops = std::exp((1 - t) * std::log(a.gflops) + t * std::log(b.gflops));
  }
  return 2.0 * double(m) * double(n) * double(k) / (gflops * 1e9);
}

AlphaBeta fit_alpha_beta(Collective kind, int ranks, const std::vector<CommPoint>& points) {
  const std::string what = std::string(collective_name(kind)) + " over " +
                           std::to_string(ranks) + " ranks";
  CLEAVE_CHECK(ranks >= 2, "fitting " << what << ": no link between ranks to fit");
  std::set<double> sizes;
  for (const CommPoint& p : points) {
    CLEAVE_CHECK(p.bytes > 0 && p.seconds > 0,
                 "fitting " << what << ": " << p.bytes << " bytes in " << p.seconds << " s");
    sizes.insert(p.bytes);
  }
  CLEAVE_CHECK(sizes.size() >= 2, "fitting " << what << ": needs two sizes or more, has "
                                             << sizes.size());
  // time = c0 + c1 x, x the bytes sent, weights 1 / time^2: the normal equations of
  // sum w (c0 + c1 x - t)^2.
  double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (const CommPoint& p : points) {
    const double w = 1 / (p.seconds * p.seconds), x = ring_bytes_sent(kind, p.bytes, ranks);
    sw += w, sx += w * x, sxx += w * x * x, st += w * p.seconds, sxt += w * x * p.seconds;
  }
  const double det = sw * sxx - sx * sx;
  double c0 = (sxx * st - sx * sxt) / det, c1 = (sw * sxt - sx * st) / det;
  if (c0 < 0) c0 = 0, c1 = sxt / sxx;  // the best fit through the origin
  if (!(c1 > 0)) {
    // Times that do not grow with size: noise (a loaded machine's scheduler) swamps the small
    // messages. The latency is then the fastest time, and the bandwidth what the largest message
    // adds to it (or its own rate); calibrate prints the fit's error, which shows it.
    const CommPoint* largest = &points.front();
    double fastest = points.front().seconds;
    for (const CommPoint& p : points) {
      if (p.bytes > largest->bytes) largest = &p;
      fastest = std::min(fastest, p.seconds);
    }
    const double x = ring_bytes_sent(kind, largest->bytes, ranks);
    c0 = largest->seconds > fastest ? fastest : 0;
    c1 = (largest->seconds - c0) / x;
  }
  return {c0 / ring_steps(kind, ranks) * 1e6, 1 / c1 / 1e9, 0};
}

double relative_error(const CollectiveCost& cost, Collective kind, int ranks,
                      const std::vector<CommPoint>& points) {
  double sum = 0;
  for (const CommPoint& p : points) {
    const double e = (cost_seconds(cost, kind, p.bytes, ranks) - p.seconds) / p.seconds;
    sum += e * e;
  }
  return points.empty() ? 0 : std::sqrt(sum / double(points.size()));
}

CollectiveCost fit_collective(Collective kind, int ranks, const std::vector<CommPoint>& points) {
  const CollectiveCost one = {fit_alpha_beta(kind, ranks, points)};
  std::set<double> size_set;
  for (const CommPoint& p : points) size_set.insert(p.bytes);
  const std::vector<double> sizes(size_set.begin(), size_set.end());
  CollectiveCost best = one;
  double best_error = relative_error(one, kind, ranks, points) * 0.75;
  // A line that fits to rounding needs no second one (two lines' rounding can come out lower).
  if (best_error < 1e-9) return best;
  for (size_t split = 2; split + 2 <= sizes.size(); ++split) {
    std::vector<CommPoint> below, above;
    for (const CommPoint& p : points) (p.bytes < sizes[split] ? below : above).push_back(p);
    CollectiveCost two;
    try {
      two = {fit_alpha_beta(kind, ranks, below), fit_alpha_beta(kind, ranks, above)};
    } catch (const Error&) {  // a side whose times do not grow: no line there
      continue;
    }
    if (!(two[1].beta_gbps < two[0].beta_gbps)) continue;
    two[1].from_bytes = int64_t(std::llround(std::sqrt(sizes[split - 1] * sizes[split])));
    const double error = relative_error(two, kind, ranks, points);
    if (error < best_error) best = two, best_error = error;
  }
  return best;
}

}  // namespace cleave
