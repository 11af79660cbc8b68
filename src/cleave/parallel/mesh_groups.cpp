#include "cleave/parallel/mesh_groups.h"

#include <algorithm>

namespace cleave {

std::unique_ptr<Group> make_group(const Mesh& mesh, int rank, const std::vector<Axis>& axes,
                                  const std::string& name) {
  return make_group(mesh.group(rank, axes), rank, name);
}

std::unique_ptr<Group> make_group(const std::vector<int>& members, int rank,
                                  const std::string& name) {
  const auto me = std::find(members.begin(), members.end(), rank);
  const int color = me == members.end() ? MPI_UNDEFINED : members.front();
  const int key = int(me - members.begin());
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
  if (comm == MPI_COMM_NULL) return nullptr;
  auto group = std::make_unique<Group>(comm, name);
  MPI_Comm_free(&comm);  // the Group holds its own duplicate
  return group;
}

}  // namespace cleave
