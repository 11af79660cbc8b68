// Task factories (internal): the MPI implementations (mpi_tasks.cpp), cleave's ring algorithms
// (ring.cpp) and the group bookkeeping tasks. All buffers must stay valid until the Work completes.
#pragma once
#include <functional>
#include <vector>

#include "cleave/comm/internal.h"

namespace cleave::comm_detail {

struct CollArgs {
  MPI_Comm comm = MPI_COMM_NULL;       // MPI's collectives and the user's send/recv
  MPI_Comm ring_comm = MPI_COMM_NULL;  // point-to-point traffic of our algorithms
  int rank = 0, size = 1;
  CommType type = CommType::f32;
  int64_t count = 0;  // as in group.h for the op
  const void* send = nullptr;
  void* recv = nullptr;  // all_reduce / broadcast / recv: the buffer
  int peer = 0;          // root of broadcast, peer of send/recv
  int tag = 0;
  std::vector<int64_t> send_counts, recv_counts;  // all_to_allv; gatherv: recv_counts
};

// MPI's collectives (nonblocking MPI_I*, polled by the progress thread).
std::unique_ptr<Task> mpi_task(Op op, const CollArgs& a);
// cleave's chunked, pipelined ring for all_reduce, all_gather and reduce_scatter.
std::unique_ptr<Task> ring_task(Op op, const CollArgs& a);
// For tests: elements per ring message and messages in flight (1..8), for ring collectives issued
// from now on. Every rank must use the same geometry (both ends of a message compute its size).
void set_ring_geometry(int64_t chunk_elems, int64_t window);
// The bytes of the engine's scratch a ring all_reduce or reduce_scatter of `count` elements (as in
// group.h) over `size` ranks writes: the received partial sums' staging, up to the window of
// chunks, and the fp32 partial sums of a bf16 or reduce_scatter ring of more than 2 ranks.
int64_t ring_scratch_bytes(Op op, int64_t count, CommType t, int size);
void reset_ring_geometry();

// Creating a group: duplicates `parent` twice (MPI_Comm_idup) and learns the group's rank, size
// and members (world ranks), written to `out` when the task completes.
struct GroupInfo {
  MPI_Comm comm = MPI_COMM_NULL, ring_comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::vector<int> members;
};
std::unique_ptr<Task> create_group_task(MPI_Comm parent, GroupInfo* out);
std::unique_ptr<Task> destroy_group_task(MPI_Comm comm, MPI_Comm ring_comm);

}  // namespace cleave::comm_detail
