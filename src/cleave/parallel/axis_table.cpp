#include "cleave/parallel/axis_table.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave {

std::vector<std::string> GroupAxes::replicate() const {
  std::vector<std::string> out;
  for (const std::string& a : reduce)
    if (std::find(shard.begin(), shard.end(), a) == shard.end()) out.push_back(a);
  return out;
}

AxisTable axis_table(const ParamStore& params, const Mesh& mesh) {
  AxisTable t;
  const bool cp = mesh.degree(Axis::cp) > 1;
  bool ep = false;
  for (const CarvedAxis& c : mesh.carved()) ep = ep || c.name == kEp;
  std::vector<std::string> data = {"dp_replicate", "dp_shard"}, shard = {"dp_shard"};
  if (cp) data.push_back("cp"), shard.push_back("cp");
  t.batch = data;
  t.model = {"pp", "tp"};
  for (int g = 0; g < params.n_groups(); ++g) {
    const std::string& name = params.group_name(g);
    // Dense parameters: every data-parallel rank holds a replica of its tp share and stage;
    // tp's pending sums are per tensor, in its placement, and come first. Experts likewise
    // unless ep splits them: then each expert's gradient sums over the ranks holding it,
    // dp_replicate x efsdp, sharded over efsdp.
    CLEAVE_CHECK(name == "dense" || name == "experts",
                 "parameter group " << name << " maps to no mesh axes");
    if (name == "experts" && ep)
      t.groups.push_back({name, {"dp_replicate", kEfsdp}, {kEfsdp}, {kEp}});
    else
      t.groups.push_back({name, data, shard});
  }
  return t;
}

int flat_coordinate(const Mesh& mesh, int rank, const std::vector<std::string>& axes) {
  const std::vector<int> ranks = mesh.group(rank, axes);
  return int(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
}

int flat_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  return int(mesh.group(0, axes).size());
}

}  // namespace cleave
