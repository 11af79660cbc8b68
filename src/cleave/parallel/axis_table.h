// The one table of the mesh axes each parameter group's gradients are summed over and its state
// sharded over, and of the axes that split the batch and the model (docs/architecture.md,
// Parameter groups). The data-parallel reduction, the gradient norm, the loss sum and the
// checkpoint file numbering all read it, so a new kind of parameter (experts, reduced over
// dp_replicate x efsdp) is a new row, not a new branch in each of them.
#pragma once
#include <string>
#include <vector>

#include "cleave/mesh/mesh.h"
#include "cleave/model/params.h"

namespace cleave {

struct GroupAxes {
  std::string group;                // ParamStore::group_name
  std::vector<std::string> reduce;  // its gradient is a sum over these ranks
  std::vector<std::string> shard;   // ZeRO shards its state over these (a part of reduce)
  // The ranks that hold different tensors of the group beside the model axes (the experts' ep):
  // its gradient norm sums over them, and each holds its own checkpoint files.
  std::vector<std::string> spread = {};
  // reduce less shard: where the shards are replicated (HSDP's dp_replicate).
  std::vector<std::string> replicate() const;
};

struct AxisTable {
  std::vector<std::string> batch;  // the ranks holding pieces of one batch: the loss's sum
  // The ranks whose tensors differ (stages, tp shares): a block of checkpoint files each.
  std::vector<std::string> model;
  std::vector<GroupAxes> groups;   // per parameter group, in the store's order
};

// Every group of `params` with its axes on `mesh`; an error names a group no axes are known for.
// cp ranks hold pieces of one batch and the same weights: with cp > 1 the data axes are
// dp_replicate x dp_shard x cp, sharded over dp_shard x cp (torchtitan's layout); at cp 1 they
// are the groups of dp alone (the same ranks, without a third name).
AxisTable axis_table(const ParamStore& params, const Mesh& mesh);

// The rank's place among the ranks of its group along `axes` (outer axis first), and how many
// there are.
int flat_coordinate(const Mesh& mesh, int rank, const std::vector<std::string>& axes);
int flat_size(const Mesh& mesh, const std::vector<std::string>& axes);

}  // namespace cleave
