#include "cleave/parallel/mesh_groups.h"

#include <algorithm>

namespace cleave {

std::unique_ptr<Group> make_group(const Mesh& mesh, int rank, const std::vector<Axis>& axes,
                                  const std::string& name) {
  const std::vector<int> members = mesh.group(rank, axes);
  const int color = *std::min_element(members.begin(), members.end());
  const int key = int(std::find(members.begin(), members.end(), rank) - members.begin());
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
  auto group = std::make_unique<Group>(comm, name);
  MPI_Comm_free(&comm);  // the Group holds its own duplicate
  return group;
}

}  // namespace cleave
