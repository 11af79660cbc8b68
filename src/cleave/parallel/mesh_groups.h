// Communicators for the mesh's groups: every rank calls make_group for the same axes in the same
// order (MPI_Comm_split is collective over MPI_COMM_WORLD), and gets the group it belongs to.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/mesh/mesh.h"

namespace cleave {

std::unique_ptr<Group> make_group(const Mesh& mesh, int rank, const std::vector<Axis>& axes,
                                  const std::string& name);
// A group of `members` (this rank's group, ascending; empty where this rank is in none, which
// then gets null). Every rank calls it, as above.
std::unique_ptr<Group> make_group(const std::vector<int>& members, int rank,
                                  const std::string& name);

}  // namespace cleave
