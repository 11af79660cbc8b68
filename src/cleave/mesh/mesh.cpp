// The device mesh: rank = ((((pp * R + r) * S + s) * C + c) * T + t) for coordinates
// (pp, dp_replicate, dp_shard, cp, tp) and degrees (P, R, S, C, T). A carve of D out of, say,
// dp_shard x cp reads f = s * C + c as rest * D + inner. Every group is listed in ascending rank
// order, which is also coordinate order with the outer (mesh-order) axis first.
#include "cleave/mesh/mesh.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "cleave/base/check.h"

namespace cleave {

namespace {

// The product of some degrees as text; exact, or "more than 2^63 - 1" if it would overflow
// (it then cannot equal or divide any world size).
struct Product {
  int64_t value = 1;
  bool overflow = false;
  void times(int64_t d) {
    if (!overflow && __builtin_mul_overflow(value, d, &value)) overflow = true;
  }
  std::string text() const {
    return overflow ? "more than " + std::to_string(INT64_MAX) : std::to_string(value);
  }
};

// "a", "a and b", "a, b and c"
std::string join_and(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " and " : ", ";
    s += names[i];
  }
  return s;
}

int64_t stride(const MeshDegrees& d, Axis a) {
  int64_t s = 1;
  for (int i = int(a) + 1; i < kAxes; ++i) s *= d[Axis(i)];
  return s;
}

}  // namespace

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::pp: return "pp";
    case Axis::dp_replicate: return "dp_replicate";
    case Axis::dp_shard: return "dp_shard";
    case Axis::cp: return "cp";
    case Axis::tp: return "tp";
  }
  return "?";
}

int& MeshDegrees::operator[](Axis a) {
  switch (a) {
    case Axis::pp: return pp;
    case Axis::dp_replicate: return dp_replicate;
    case Axis::dp_shard: return dp_shard;
    case Axis::cp: return cp;
    case Axis::tp: return tp;
  }
  CLEAVE_FAIL("invalid mesh axis " << int(a));
}

int MeshDegrees::operator[](Axis a) const { return const_cast<MeshDegrees&>(*this)[a]; }

Mesh::Mesh(int world, MeshDegrees degrees) : world_(world), degrees_(degrees) {
  if (world < 1) CLEAVE_FAIL("the world size must be >= 1 (got " << world << ")");
  std::vector<std::string> rest;  // the axes set to -1
  for (Axis a : kMeshAxes) {
    const int d = degrees[a];
    if (d == -1) rest.push_back(axis_name(a));
    else if (d < 1) CLEAVE_FAIL("degree must be >= 1 or -1 (" << axis_name(a) << " = " << d << ")");
  }
  if (rest.size() > 1)
    CLEAVE_FAIL("-1 is allowed on one axis only (" << join_and(rest)
                << (rest.size() == 2 ? " are both -1)" : " are all -1)"));
  Product product;
  for (Axis a : kMeshAxes)
    if (degrees[a] != -1) product.times(degrees[a]);
  if (rest.size() == 1) {
    if (product.overflow || world % product.value != 0)
      CLEAVE_FAIL(rest[0] << " = -1: the other degrees multiply to " << product.text()
                          << ", which does not divide the world size " << world);
    for (Axis a : kMeshAxes)
      if (degrees_[a] == -1) degrees_[a] = int(world / product.value);
    return;
  }
  if (product.overflow || product.value != world) {
    std::ostringstream os;
    for (Axis a : kMeshAxes) os << (a == Axis::pp ? "" : " x ") << axis_name(a) << "=" << degrees[a];
    CLEAVE_FAIL("parallel degrees " << os.str() << " = " << product.text()
                                    << " do not multiply to the world size " << world);
  }
}

namespace {

void check_rank(int rank, int world) {
  if (rank < 0 || rank >= world)
    CLEAVE_FAIL("rank " << rank << " is outside the world of " << world << " ranks");
}

int product_of(const Mesh& mesh, const std::vector<Axis>& axes) {
  int p = 1;
  for (Axis a : axes) p *= mesh.degree(a);
  return p;
}

// "dp_shard x cp"
std::string product_name(const std::vector<Axis>& axes) {
  std::string s;
  for (Axis a : axes) s += (s.empty() ? "" : " x ") + std::string(axis_name(a));
  return s;
}

const Axis* whole_axis(std::string_view name) {
  for (const Axis& a : kMeshAxes)
    if (name == axis_name(a)) return &a;
  return nullptr;
}

void check_axis(Axis a) {
  if (int(a) < 0 || int(a) >= kAxes) CLEAVE_FAIL("invalid mesh axis " << int(a));
}

std::vector<std::string> names_of(const std::vector<Axis>& axes) {
  std::vector<std::string> names;
  for (Axis a : axes) {
    check_axis(a);
    names.push_back(axis_name(a));
  }
  return names;
}

// A rank is a mixed-radix number whose digits are the whole axes, with a carve splitting the
// digit of its (consecutive) axes' flattened product into rest * degree + inner: a group is
// the ranks that differ from one another on its digits only.
struct Digit {
  int64_t stride;
  int degree;
  int of(int rank) const { return int(rank / stride % degree); }
};

// The digits of a set of named axes in mesh order, outer first, whatever order they are listed in
// and however often.
std::vector<Digit> digits(const Mesh& mesh, const std::vector<std::string>& axes) {
  const std::vector<CarvedAxis>& carved = mesh.carved();
  std::string by[kAxes];  // the first named axis that covers each whole axis
  int carve_of[kAxes];    // and its carve, or -1 for the whole axis itself (set where by[] is)
  std::vector<char> inner(carved.size()), rest(carved.size());
  for (const std::string& name : axes) {
    int k = -1;
    std::vector<Axis> covers;
    if (const Axis* a = whole_axis(name)) {
      covers = {*a};
    } else {
      while (++k < int(carved.size()) && carved[k].name != name && carved[k].rest != name) {}
      if (k == int(carved.size())) {
        std::vector<std::string> known = names_of({std::begin(kMeshAxes), std::end(kMeshAxes)});
        for (const CarvedAxis& c : carved) known.insert(known.end(), {c.rest, c.name});
        CLEAVE_FAIL("unknown mesh axis '" << name << "' (the mesh has " << join_and(known) << ")");
      }
      covers = carved[k].from;
      (carved[k].name == name ? inner : rest)[k] = 1;
    }
    for (Axis a : covers) {
      const int i = int(a);
      if (by[i].empty()) {
        by[i] = name;
        carve_of[i] = k;
      } else if (by[i] != name && (k < 0 || carve_of[i] != k)) {
        CLEAVE_FAIL("mesh axes " << by[i] << " and " << name << " overlap on " << axis_name(a)
                                 << ": a group cannot be along both");
      }
    }
  }
  const MeshDegrees& d = mesh.degrees();
  std::vector<Digit> out;
  for (Axis a : kMeshAxes) {
    const int i = int(a);
    if (by[i].empty()) continue;
    if (carve_of[i] < 0) {
      out.push_back({stride(d, a), d[a]});
      continue;
    }
    const CarvedAxis& c = carved[carve_of[i]];
    if (a != c.from.front()) continue;
    const int64_t s = stride(d, c.from.back());
    if (rest[carve_of[i]]) out.push_back({s * c.degree, product_of(mesh, c.from) / c.degree});
    if (inner[carve_of[i]]) out.push_back({s, c.degree});
  }
  return out;
}

std::vector<int> group_of(int rank, const std::vector<Digit>& ds) {
  int64_t base = rank;
  for (const Digit& d : ds) base -= d.of(rank) * d.stride;
  std::vector<int> ranks{int(base)};
  for (const Digit& d : ds) {
    std::vector<int> next;
    next.reserve(ranks.size() * d.degree);
    for (int r : ranks)
      for (int k = 0; k < d.degree; ++k) next.push_back(int(r + k * d.stride));
    ranks = std::move(next);
  }
  return ranks;
}

}  // namespace

std::array<int, kAxes> Mesh::coords(int rank) const {
  check_rank(rank, world_);
  std::array<int, kAxes> c{};
  for (Axis a : kMeshAxes) c[int(a)] = int(rank / stride(degrees_, a) % degrees_[a]);
  return c;
}

int Mesh::rank_of(const std::array<int, kAxes>& coords) const {
  int64_t rank = 0;
  for (Axis a : kMeshAxes) {
    const int c = coords[int(a)];
    if (c < 0 || c >= degrees_[a])
      CLEAVE_FAIL(axis_name(a) << " coordinate " << c << " is outside [0, " << degrees_[a]
                               << ") (" << axis_name(a) << " degree " << degrees_[a] << ")");
    rank = rank * degrees_[a] + c;
  }
  return int(rank);
}

std::vector<int> Mesh::group(int rank, Axis a) const { return group(rank, std::vector<Axis>{a}); }

std::vector<int> Mesh::group(int rank, const std::vector<Axis>& axes) const {
  return group(rank, names_of(axes));
}

std::vector<std::vector<int>> Mesh::all_groups(const std::vector<Axis>& axes) const {
  return all_groups(names_of(axes));
}

void Mesh::carve(const std::string& name, int degree, const std::vector<Axis>& from,
                 const std::string& rest) {
  for (const std::string& n : {name, rest}) {
    if (n.empty()) CLEAVE_FAIL("a carved mesh axis needs a name");
    const bool taken = whole_axis(n) || std::any_of(carved_.begin(), carved_.end(),
                                                    [&](const CarvedAxis& c) {
                                                      return c.name == n || c.rest == n;
                                                    });
    if (taken) CLEAVE_FAIL("mesh axis " << n << " exists already");
  }
  if (name == rest)
    CLEAVE_FAIL("the two parts of a carve need two names (both are " << name << ")");
  for (Axis a : from) check_axis(a);
  std::vector<Axis> axes = from;
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (axes.empty()) CLEAVE_FAIL(name << " is carved from no mesh axes");
  for (size_t i = 1; i < axes.size(); ++i)
    if (int(axes[i]) != int(axes[i - 1]) + 1)
      CLEAVE_FAIL(name << " must be carved from consecutive mesh axes, not from "
                       << product_name(axes)
                       << " (mesh order: pp, dp_replicate, dp_shard, cp, tp)");
  if (degree < 1) CLEAVE_FAIL("degree must be >= 1 (" << name << " = " << degree << ")");
  const int product = product_of(*this, axes);
  if (product % degree != 0)
    CLEAVE_FAIL(name << " " << degree << " does not divide " << product_name(axes) << " = "
                     << product);
  carved_.push_back({name, rest, degree, std::move(axes)});
}

int Mesh::degree(std::string_view axis) const {
  return digits(*this, {std::string(axis)})[0].degree;
}

int Mesh::coord(int rank, std::string_view axis) const {
  check_rank(rank, world_);
  return digits(*this, {std::string(axis)})[0].of(rank);
}

std::vector<int> Mesh::group(int rank, const std::vector<std::string>& axes) const {
  check_rank(rank, world_);
  return group_of(rank, digits(*this, axes));
}

std::vector<std::vector<int>> Mesh::all_groups(const std::vector<std::string>& axes) const {
  const std::vector<Digit> ds = digits(*this, axes);
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_; ++r)
    // A group's smallest rank is the one at coordinate 0 on every one of its digits.
    if (std::all_of(ds.begin(), ds.end(), [&](const Digit& d) { return d.of(r) == 0; }))
      groups.push_back(group_of(r, ds));
  return groups;
}

void carve_ep(Mesh& mesh, int ep) { mesh.carve(kEp, ep, {Axis::dp_shard, Axis::cp}, kEfsdp); }

namespace {

const char* what_it_communicates(Axis a) {
  switch (a) {
    case Axis::pp: return "activations and gradients point-to-point between stages";
    case Axis::dp_replicate: return "gradient all-reduce";
    case Axis::dp_shard:
      return "parameter all-gather and gradient reduce-scatter (ZeRO/FSDP)";
    case Axis::cp:
      return "attention's K/V ring (ring, hybrid), all-gather / reduce-scatter (allgather) or "
             "all-to-all (ulysses), and with the data axes the gradient reduction";
    case Axis::tp: return "all-reduce / all-gather / reduce-scatter of activations within each block";
  }
  return "?";
}

const char* what_it_communicates(const std::string& carved) {
  if (carved == kEp) return "token all-to-all to and from the experts (dispatch and combine)";
  if (carved == kEfsdp)
    return "expert parameter all-gather and gradient reduce-scatter (ZeRO/FSDP of the experts)";
  if (carved == kCpUlyssesAxis) return "all-to-all of q, k, v and the output (hybrid's Ulysses)";
  if (carved == kCpRingAxis) return "K/V and their gradients around the ring (hybrid's ring)";
  return "a carved axis: no collective of cleave runs on it";
}

std::string rank_list(const std::vector<int>& g) {
  std::string s = "[";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + std::to_string(g[i]);
  return s + "]";
}

struct Section {
  std::string title;  // e.g. "tp (degree 2)"
  std::string what;
  std::vector<std::string> axes;
};

}  // namespace

std::string describe_mesh(const Mesh& mesh, int ranks_per_host) {
  if (ranks_per_host < 1) CLEAVE_FAIL("ranks per host must be >= 1 (got " << ranks_per_host << ")");
  const int world = mesh.world();
  const int hosts = (world + ranks_per_host - 1) / ranks_per_host;
  std::ostringstream os;
  os << "device mesh: world " << world << " = ";
  for (Axis a : kMeshAxes) os << (a == Axis::pp ? "" : " x ") << axis_name(a) << " " << mesh.degree(a);
  os << "\nhosts: " << hosts << (hosts == 1 ? " host" : " hosts") << " of " << ranks_per_host
     << (ranks_per_host == 1 ? " rank" : " ranks");
  if (world % ranks_per_host != 0) os << " (the last holds " << world % ranks_per_host << ")";
  if (hosts > 1) os << "; rank r is on host r / " << ranks_per_host;
  os << "\n";

  std::vector<Section> sections;
  for (Axis a : kMeshAxes)
    if (mesh.degree(a) > 1)
      sections.push_back({std::string(axis_name(a)) + " (degree " + std::to_string(mesh.degree(a)) + ")",
                          what_it_communicates(a), {axis_name(a)}});
  const int R = mesh.degree(Axis::dp_replicate), S = mesh.degree(Axis::dp_shard);
  if (R > 1 && S > 1) {  // HSDP: the whole data-parallel group, after dp_shard
    auto at = std::find_if(sections.begin(), sections.end(),
                           [](const Section& s) { return s.axes[0] == "dp_shard"; });
    sections.insert(at + 1, {"dp = dp_replicate x dp_shard (degree " + std::to_string(R) + " x " +
                                 std::to_string(S) + " = " + std::to_string(R * S) + ")",
                             "the whole data-parallel group (each rank reads its own slice of the "
                             "batch)",
                             {"dp_replicate", "dp_shard"}});
  }
  for (const CarvedAxis& c : mesh.carved()) {
    const std::string of = product_name(c.from) + " = " + std::to_string(product_of(mesh, c.from));
    for (const auto& [name, part] : {std::pair{c.rest, "outer"}, std::pair{c.name, "inner"}})
      if (mesh.degree(name) > 1)
        sections.push_back({name + " (degree " + std::to_string(mesh.degree(name)) +
                                ", carved from " + of + ", " + part + ")",
                            what_it_communicates(name), {name}});
  }
  if (sections.empty()) {
    os << "\nevery degree is 1: a single rank, nothing is communicated\n";
    return os.str();
  }

  int total_groups = 0, total_crossing = 0;
  std::vector<std::string> crossing_axes;
  for (const Section& sec : sections) {
    const std::vector<std::vector<int>> groups = mesh.all_groups(sec.axes);
    size_t width = 0;
    for (const auto& g : groups) width = std::max(width, rank_list(g).size());
    int crossing = 0;
    std::ostringstream lines;
    for (const auto& g : groups) {
      const std::string list = rank_list(g);
      lines << "  " << list << std::string(width - list.size() + 2, ' ');
      std::vector<int> on;  // the hosts the group spans, ascending since the ranks are
      for (int r : g)
        if (on.empty() || on.back() != r / ranks_per_host) on.push_back(r / ranks_per_host);
      if (on.size() == 1) {
        lines << "intra-host (host " << on[0] << ")\n";
      } else {
        ++crossing;
        lines << "crosses hosts (";
        for (size_t i = 0; i < on.size(); ++i) lines << (i ? ", " : "") << on[i];
        lines << ")\n";
      }
    }
    const int n = int(groups.size());
    os << "\n" << sec.title << ": " << sec.what << "\n"
       << "  " << n << (n == 1 ? " group" : " groups") << " of " << groups[0].size() << " ranks: "
       << n - crossing << " intra-host, " << crossing << " crossing hosts\n"
       << lines.str();
    total_groups += n;
    total_crossing += crossing;
    if (crossing > 0) crossing_axes.push_back(sec.title.substr(0, sec.title.find(' ')));
  }
  os << "\nsummary: " << total_groups << (total_groups == 1 ? " group" : " groups") << " on "
     << sections.size() << (sections.size() == 1 ? " axis" : " axes") << ", "
     << total_crossing << " crossing hosts";
  if (!crossing_axes.empty()) os << " (" << join_and(crossing_axes) << ")";
  os << "\n";
  return os.str();
}

}  // namespace cleave
