// The device mesh: rank = ((((pp * R + r) * S + s) * C + c) * T + t) for coordinates
// (pp, dp_replicate, dp_shard, cp, tp) and degrees (P, R, S, C, T). Every group is listed in
// ascending rank order, which is also coordinate order with the outer (mesh-order) axis first.
#include "cleave/mesh/mesh.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "cleave/base/check.h"

namespace cleave {

namespace {

constexpr Axis kAllAxes[kAxes] = {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp, Axis::tp};

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
  for (Axis a : kAllAxes) {
    const int d = degrees[a];
    if (d == -1) rest.push_back(axis_name(a));
    else if (d < 1) CLEAVE_FAIL("degree must be >= 1 or -1 (" << axis_name(a) << " = " << d << ")");
  }
  if (rest.size() > 1)
    CLEAVE_FAIL("-1 is allowed on one axis only (" << join_and(rest)
                << (rest.size() == 2 ? " are both -1)" : " are all -1)"));
  Product product;
  for (Axis a : kAllAxes)
    if (degrees[a] != -1) product.times(degrees[a]);
  if (rest.size() == 1) {
    if (product.overflow || world % product.value != 0)
      CLEAVE_FAIL(rest[0] << " = -1: the other degrees multiply to " << product.text()
                          << ", which does not divide the world size " << world);
    for (Axis a : kAllAxes)
      if (degrees_[a] == -1) degrees_[a] = int(world / product.value);
    return;
  }
  if (product.overflow || product.value != world) {
    std::ostringstream os;
    for (Axis a : kAllAxes) os << (a == Axis::pp ? "" : " x ") << axis_name(a) << "=" << degrees[a];
    CLEAVE_FAIL("parallel degrees " << os.str() << " = " << product.text()
                                    << " do not multiply to the world size " << world);
  }
}

std::array<int, kAxes> Mesh::coords(int rank) const {
  if (rank < 0 || rank >= world_)
    CLEAVE_FAIL("rank " << rank << " is outside the world of " << world_ << " ranks");
  std::array<int, kAxes> c{};
  for (Axis a : kAllAxes) c[int(a)] = int(rank / stride(degrees_, a) % degrees_[a]);
  return c;
}

int Mesh::rank_of(const std::array<int, kAxes>& coords) const {
  int64_t rank = 0;
  for (Axis a : kAllAxes) {
    const int c = coords[int(a)];
    if (c < 0 || c >= degrees_[a])
      CLEAVE_FAIL(axis_name(a) << " coordinate " << c << " is outside [0, " << degrees_[a]
                               << ") (" << axis_name(a) << " degree " << degrees_[a] << ")");
    rank = rank * degrees_[a] + c;
  }
  return int(rank);
}

std::vector<int> Mesh::group(int rank, Axis a) const { return group(rank, std::vector<Axis>{a}); }

// Whatever order the caller lists the axes in (and repeats aside), the group is flattened in mesh
// order, outer axis first: that is ascending rank order.
std::vector<int> Mesh::group(int rank, const std::vector<Axis>& axes) const {
  const std::array<int, kAxes> c = coords(rank);
  bool in[kAxes] = {};
  for (Axis a : axes) {
    if (int(a) < 0 || int(a) >= kAxes) CLEAVE_FAIL("invalid mesh axis " << int(a));
    in[int(a)] = true;
  }
  int64_t base = rank;
  for (Axis a : kAllAxes)
    if (in[int(a)]) base -= c[int(a)] * stride(degrees_, a);
  std::vector<int> ranks{int(base)};
  for (Axis a : kAllAxes) {
    if (!in[int(a)]) continue;
    const int64_t s = stride(degrees_, a);
    std::vector<int> next;
    next.reserve(ranks.size() * degrees_[a]);
    for (int r : ranks)
      for (int k = 0; k < degrees_[a]; ++k) next.push_back(int(r + k * s));
    ranks = std::move(next);
  }
  return ranks;
}

std::vector<std::vector<int>> Mesh::all_groups(const std::vector<Axis>& axes) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_; ++r) {
    const std::array<int, kAxes> c = coords(r);
    // A group's smallest rank is the one at coordinate 0 on every one of its axes.
    const bool first = std::all_of(axes.begin(), axes.end(), [&](Axis a) { return c[int(a)] == 0; });
    if (first) groups.push_back(group(r, axes));
  }
  return groups;
}

namespace {

const char* what_it_communicates(Axis a) {
  switch (a) {
    case Axis::pp: return "activations and gradients point-to-point between stages";
    case Axis::dp_replicate: return "gradient all-reduce";
    case Axis::dp_shard:
      return "parameter all-gather and gradient reduce-scatter (ZeRO/FSDP)";
    case Axis::cp: return "K/V ring (ring attention) or all-to-all (Ulysses)";
    case Axis::tp: return "all-reduce / all-gather / reduce-scatter of activations within each block";
  }
  return "?";
}

std::string rank_list(const std::vector<int>& g) {
  std::string s = "[";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + std::to_string(g[i]);
  return s + "]";
}

struct Section {
  std::string title;  // e.g. "tp (degree 2)"
  std::string what;
  std::vector<Axis> axes;
};

}  // namespace

std::string describe_mesh(const Mesh& mesh, int ranks_per_host) {
  if (ranks_per_host < 1) CLEAVE_FAIL("ranks per host must be >= 1 (got " << ranks_per_host << ")");
  const int world = mesh.world();
  const int hosts = (world + ranks_per_host - 1) / ranks_per_host;
  std::ostringstream os;
  os << "device mesh: world " << world << " = ";
  for (Axis a : kAllAxes) os << (a == Axis::pp ? "" : " x ") << axis_name(a) << " " << mesh.degree(a);
  os << "\nhosts: " << hosts << (hosts == 1 ? " host" : " hosts") << " of " << ranks_per_host
     << (ranks_per_host == 1 ? " rank" : " ranks");
  if (world % ranks_per_host != 0) os << " (the last holds " << world % ranks_per_host << ")";
  if (hosts > 1) os << "; rank r is on host r / " << ranks_per_host;
  os << "\n";

  std::vector<Section> sections;
  for (Axis a : kAllAxes)
    if (mesh.degree(a) > 1)
      sections.push_back({std::string(axis_name(a)) + " (degree " + std::to_string(mesh.degree(a)) + ")",
                          what_it_communicates(a), {a}});
  const int R = mesh.degree(Axis::dp_replicate), S = mesh.degree(Axis::dp_shard);
  if (R > 1 && S > 1) {  // HSDP: the whole data-parallel group, after dp_shard
    auto at = std::find_if(sections.begin(), sections.end(),
                           [](const Section& s) { return s.axes[0] == Axis::dp_shard; });
    sections.insert(at + 1, {"dp = dp_replicate x dp_shard (degree " + std::to_string(R) + " x " +
                                 std::to_string(S) + " = " + std::to_string(R * S) + ")",
                             "the whole data-parallel group (each rank reads its own slice of the "
                             "batch)",
                             {Axis::dp_replicate, Axis::dp_shard}});
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
