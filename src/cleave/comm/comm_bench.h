// Collective benchmark behind `cleave bench-comm`: times cleave's and MPI's implementation of each
// collective over a range of sizes and reports algbw and busbw as nccl-tests defines them:
//   algbw = size / time, with size the buffer of all_reduce and broadcast, the gathered output of
//           all_gather, the input of reduce_scatter, and the send buffer of all_to_all;
//   busbw = algbw * 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
//           all_to_all, 1 for broadcast and send_recv (n: ranks in the group).
// send_recv is nccl-tests' sendrecv: every rank sends its buffer to the next rank of the group and
// receives the previous rank's at once (a ring shift, as pipeline stages and ring attention pass
// activations on); size is the buffer one rank sends.
// Collective: every rank of the group must call with the same options; all ranks return the rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/comm/group.h"

namespace cleave {

struct CommBenchOptions {
  int64_t min_bytes = int64_t(4) << 10;
  int64_t max_bytes = int64_t(256) << 20;
  int factor = 4;  // sizes min, min*factor, ... up to max
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                  "all_to_all", "send_recv"};
  std::vector<CommType> types = {CommType::f32};
  // The implementations to time, where a collective has them (ours: all_reduce, all_gather and
  // reduce_scatter); the others run as MPI's alone and report CommAlgo::mpi. CommAlgo::fastest
  // times what the trainer's tensor, context and expert parallel groups call.
  std::vector<CommAlgo> algos = {CommAlgo::ours, CommAlgo::mpi};
  int warmup = 2;
  double seconds_per_case = 0.2;  // iterations per case: about this long, at least 3, at most 50
};

struct CommBenchRow {
  std::string op;
  CommAlgo algo;  // as in CommBenchOptions::algos
  CommType type;
  int64_t bytes;  // the nccl-tests size
  int iterations;
  double seconds;  // median over iterations of the slowest rank's time
  double algbw, busbw;  // GB/s (1e9 bytes per second)
};

double busbw_factor(const std::string& op, int ranks);

std::vector<CommBenchRow> bench_comm(Group& g, const CommBenchOptions& options);

// Does an all_reduce progress while this thread computes? Times the all_reduce alone, a fixed
// single-threaded computation alone (calibrated to about twice as long), then both: the all_reduce
// issued, the computation run, then wait(). Overlap works when `waited` is small against
// `comm_alone` and `compute_with_comm` stays close to `compute_alone`. Collective.
struct OverlapResult {
  int64_t bytes;
  CommAlgo algo;
  double comm_alone, compute_alone, compute_with_comm, waited;  // seconds
};
OverlapResult measure_overlap(Group& g, int64_t bytes, CommAlgo algo);

// What a rank pays to meet the others at a small collective between short computations, as tensor
// parallelism's ranks meet at every linear: pieces of the computation above (each about `piece`
// seconds on this rank), each followed by a one-float all_reduce, alternately through the group
// (cleave's progress thread runs it and this thread blocks in Work::wait, as the trainer's do) and
// by MPI_Allreduce called from this thread (MPI's own wait, as an engine without a progress thread
// waits), in runs of 8 for about `seconds`, so that both see the same machine. Per meeting, the
// wall time beyond the ranks' mean time for the piece: what the slowest rank's pace and the wait's
// own wake-ups cost. Collective.
struct MeetingResult {
  double piece = 0;                   // seconds of computation per piece (the ranks' mean)
  double ours_extra = 0, mpi_extra = 0;  // seconds per meeting beyond it
  int64_t meetings = 0;               // of each kind
};
MeetingResult measure_meetings(Group& g, double piece, double seconds);

}  // namespace cleave
