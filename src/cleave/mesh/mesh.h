// The device mesh (docs/architecture.md, Placements): a pure function from (world size, degrees) to
// the groups of every axis. Axes outermost to innermost: pp, dp_replicate, dp_shard, cp, tp; tp
// innermost so its groups are consecutive ranks (one host). No MPI here: unit-tested on its own.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace cleave {

enum class Axis { pp = 0, dp_replicate = 1, dp_shard = 2, cp = 3, tp = 4 };
constexpr int kAxes = 5;
const char* axis_name(Axis a);

struct MeshDegrees {  // -1 on at most one axis: "the rest of the world"
  int pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1;
  int& operator[](Axis a);
  int operator[](Axis a) const;
};

class Mesh {
 public:
  // Resolves -1 and validates: the degrees must multiply to world (error naming the product and
  // the world size), be >= 1, at most one -1 (and the rest must divide world).
  Mesh(int world, MeshDegrees degrees);

  int world() const { return world_; }
  const MeshDegrees& degrees() const { return degrees_; }
  int degree(Axis a) const { return degrees_[a]; }

  // Coordinates of a rank on every axis, and back.
  std::array<int, kAxes> coords(int rank) const;
  int rank_of(const std::array<int, kAxes>& coords) const;

  // The ranks of `rank`'s group along one axis (ordered by coordinate), or along several axes
  // flattened (e.g. {dp_replicate, dp_shard} for the whole data-parallel group), outer first.
  std::vector<int> group(int rank, Axis a) const;
  std::vector<int> group(int rank, const std::vector<Axis>& axes) const;
  // Every group of an axis (or axes), each listed once, ordered by their smallest rank.
  std::vector<std::vector<int>> all_groups(const std::vector<Axis>& axes) const;

 private:
  int world_;
  MeshDegrees degrees_;
};

// `cleave mesh`: every group of every axis, whether it stays within one host when
// ranks_per_host consecutive ranks share a host, and what each axis communicates.
std::string describe_mesh(const Mesh& mesh, int ranks_per_host);

}  // namespace cleave
