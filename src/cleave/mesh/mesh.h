// The device mesh (docs/architecture.md, Placements): a pure function from (world size, degrees,
// carved axes) to the groups of every axis. Axes outermost to innermost: pp, dp_replicate,
// dp_shard, cp, tp; tp innermost so its groups are consecutive ranks (one host). No MPI here:
// unit-tested on its own.
#pragma once
#include <array>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace cleave {

enum class Axis { pp = 0, dp_replicate = 1, dp_shard = 2, cp = 3, tp = 4 };
constexpr int kAxes = 5;
// Every axis, outer first (the order of the mesh's coordinates).
inline constexpr Axis kMeshAxes[kAxes] = {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp,
                                          Axis::tp};
const char* axis_name(Axis a);

struct MeshDegrees {  // -1 on at most one axis: "the rest of the world"
  int pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1;
  int& operator[](Axis a);
  int operator[](Axis a) const;
};

// Two axes carved out of the flattened product of consecutive whole axes (outer axis first), as
// torchtitan's ParallelDims derives its expert axes: `name` is the inner part, `degree`
// consecutive positions of that product, `rest` the outer part, of degree product / degree.
struct CarvedAxis {
  std::string name, rest;
  int degree;
  std::vector<Axis> from;  // in mesh order
};

class Mesh {
 public:
  // Resolves -1 and validates: the degrees must multiply to world (error naming the product and
  // the world size), be >= 1, at most one -1 (and the rest must divide world).
  Mesh(int world, MeshDegrees degrees);

  int world() const { return world_; }
  const MeshDegrees& degrees() const { return degrees_; }
  int degree(Axis a) const { return degrees_[a]; }

  // Coordinates of a rank on every whole axis, and back.
  std::array<int, kAxes> coords(int rank) const;
  int rank_of(const std::array<int, kAxes>& coords) const;

  // The ranks of `rank`'s group along one axis (ordered by coordinate), or along several axes
  // flattened (e.g. {dp_replicate, dp_shard} for the whole data-parallel group), outer first.
  std::vector<int> group(int rank, Axis a) const;
  std::vector<int> group(int rank, const std::vector<Axis>& axes) const;
  // Every group of an axis (or axes), each listed once, ordered by their smallest rank.
  std::vector<std::vector<int>> all_groups(const std::vector<Axis>& axes) const;

  // Adds the axes `name` (inner, of `degree`) and `rest` (outer) carved out of the product of
  // `from`, which must be consecutive mesh axes (listed in any order) whose product `degree`
  // divides. The whole axes stay as they were. Only consecutive axes, so that every group,
  // carved or not, is a set of digits of the rank and is listed in ascending rank order.
  void carve(const std::string& name, int degree, const std::vector<Axis>& from,
             const std::string& rest);
  const std::vector<CarvedAxis>& carved() const { return carved_; }

  // The same by name, where a name is a whole axis ("pp", "tp", ...) or a carved one ("ep").
  // A set of axes may not overlap ({ep, cp} is an error) but may hold both parts of one carve
  // ({efsdp, ep} is dp_shard x cp again). Groups are ordered by coordinate, outer axis first, a
  // carve's rest before its inner part: ascending rank order. (The initializer_list overloads
  // make {"dp_replicate", "efsdp"} a list of names, not an iterator range for vector<Axis>.)
  int degree(std::string_view axis) const;
  int coord(int rank, std::string_view axis) const;
  std::vector<int> group(int rank, const std::vector<std::string>& axes) const;
  std::vector<int> group(int rank, std::initializer_list<std::string> axes) const {
    return group(rank, std::vector<std::string>(axes));
  }
  std::vector<std::vector<int>> all_groups(const std::vector<std::string>& axes) const;
  std::vector<std::vector<int>> all_groups(std::initializer_list<std::string> axes) const {
    return all_groups(std::vector<std::string>(axes));
  }

 private:
  int world_;
  MeshDegrees degrees_;
  std::vector<CarvedAxis> carved_;
};

// Expert parallelism, with torchtitan's names: a MoE layer's experts are split over the `ep`
// ranks carved (inner) out of dp_shard x cp, so an ep group never spans tp or pp; the expert
// parameters are sharded ZeRO/FSDP-style over the rest, `efsdp` (torchtitan's "efsdp", earlier
// "dp_shard_mod_ep"), and replicated over dp_replicate: {dp_replicate, efsdp} is the experts'
// whole data-parallel group, as {dp_replicate, dp_shard} is the dense parameters'.
inline constexpr char kEp[] = "ep";
inline constexpr char kEfsdp[] = "efsdp";
void carve_ep(Mesh& mesh, int ep);

// Context parallelism's hybrid mode: Ulysses all-to-alls over cp_ulysses groups of consecutive
// cp ranks (inner), ring attention over cp_ring (outer), the ranks holding the same heads.
inline constexpr char kCpUlyssesAxis[] = "cp_ulysses";
inline constexpr char kCpRingAxis[] = "cp_ring";

// `cleave mesh`: every group of every axis (carved ones too), whether it stays within one host
// when ranks_per_host consecutive ranks share a host, and what each axis communicates.
std::string describe_mesh(const Mesh& mesh, int ranks_per_host);

}  // namespace cleave
