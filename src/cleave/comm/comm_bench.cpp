// bench-comm. Each case: `warmup` untimed calls (they also grow the persistent buffers), then
// iterations of barrier + timed call; every rank takes its median, the slowest rank's median counts.
//
// Results on the development machine -- the basis of the decision table in group.cpp (`fastest`).
// 2-core AMD EPYC VM shared with other jobs, OpenMPI 4.1.4, vader shared memory (CMA single copy),
// `mpirun --oversubscribe -np 2 cleave bench-comm --type both`; busbw in GB/s, ours/MPI. Noisy:
// in other runs the cache-sized cases (64 KiB - 4 MiB) came out up to 4x lower for both sides.
//   busbw ours/mpi            4 KiB     16 KiB     64 KiB    256 KiB      1 MiB      4 MiB     16 MiB     64 MiB    256 MiB
//   all_reduce f32        0.31/0.21  0.85/0.77  2.29/0.86  3.68/1.40  7.99/2.73  9.08/2.93  4.65/1.78  3.85/1.76  3.84/1.62
//   all_reduce bf16       0.52/0.23  0.89/0.59  2.18/0.77  3.69/1.07  6.97/1.54  8.03/0.86  4.34/0.75  4.42/0.78  4.18/0.76
//   all_gather f32        0.25/0.22  0.57/0.59  1.75/1.74  3.06/2.94  6.02/5.76  6.96/7.23  3.84/4.57  3.04/3.29  2.52/3.36
//   all_gather bf16       0.31/0.21  0.64/0.61  2.00/2.00  3.87/3.70  6.64/6.66  8.45/9.70  4.51/4.67  2.86/3.19  2.89/2.96
//   reduce_scatter f32    0.31/0.20  0.86/0.57  2.76/1.33  4.88/1.22  7.11/2.15  8.42/2.50  3.47/0.63  2.47/0.50  2.54/0.58
//   reduce_scatter bf16   0.25/0.11  0.75/0.31  2.01/0.39  3.48/0.74  4.63/1.03  5.06/0.63  3.47/0.20  3.14/0.22  2.96/0.29
//   broadcast f32            -/0.31     -/1.23     -/3.84     -/4.72     -/8.14     -/9.82     -/8.93     -/6.65     -/6.24
//   all_to_all f32           -/0.18     -/0.55     -/1.54     -/4.35     -/6.84     -/7.90     -/4.16     -/3.76     -/3.32
// MPI's column is MPI's nonblocking collectives (MPI_Iallreduce is slower than the blocking
// MPI_Allreduce); its bf16 reductions go through an fp32 copy. With 3 and 4 ranks (oversubscribed
// on 2 cores, so only indicative) MPI's all_reduce won below 256 KiB (fewer rounds than the ring's
// 2(n-1) steps) and its all_gather won at every size; our reduce_scatter still won everywhere.
// Overlap (16 MiB fp32 all_reduce, 2 ranks, main thread computing meanwhile): ours ~3.5-5 ms alone,
// and wait() after twice that much computation blocked 0-1.7 ms (the computation itself slows by
// about the all_reduce's CPU time: on 2 cores the copies and sums share the cores).
#include "cleave/comm/comm_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/base/statistics.h"
#include "cleave/comm/internal.h"

namespace cleave {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The largest value over the group's ranks (every rank gets it).
double group_max(Group& g, double x) {
  std::vector<float> all(size_t(g.size()));
  float mine = float(x);
  g.all_gather(&mine, all.data(), 1, CommType::f32, CommAlgo::mpi).wait();
  return *std::max_element(all.begin(), all.end());
}

struct Buffers {
  Buffer<char> a, b;
};

// Runs one call of `op` of nccl-tests size `bytes` on the buffers, to its end.
void run(Group& g, const std::string& op, CommAlgo algo, CommType t, int64_t bytes, Buffers& buf) {
  const int64_t ts = int64_t(comm_detail::type_size(t)), n = g.size();
  if (op == "all_reduce") return (void)g.all_reduce(buf.a.data(), bytes / ts, t, algo).wait();
  if (op == "broadcast") return (void)g.broadcast(buf.a.data(), bytes / ts, t, 0).wait();
  if (op == "send_recv") {
    Work sent = g.send(buf.a.data(), bytes / ts, t, int((g.rank() + 1) % n), 0);
    g.recv(buf.b.data(), bytes / ts, t, int((g.rank() + n - 1) % n), 0).wait();
    return (void)sent.wait();
  }
  const int64_t per_rank = bytes / ts / n;
  if (op == "all_gather")
    return (void)g.all_gather(buf.a.data(), buf.b.data(), per_rank, t, algo).wait();
  if (op == "reduce_scatter")
    return (void)g.reduce_scatter(buf.a.data(), buf.b.data(), per_rank, t, algo).wait();
  if (op == "all_to_all") return (void)g.all_to_all(buf.a.data(), buf.b.data(), per_rank, t).wait();
  CLEAVE_FAIL("bench-comm: unknown collective '" << op << "'");
}

// The size bench-comm reports for `bytes` requested (whole elements per rank); 0 where the op
// does not apply (send_recv within one rank).
int64_t actual_bytes(const std::string& op, int64_t bytes, int64_t ts, int64_t n) {
  if (op == "send_recv") return n > 1 ? bytes / ts * ts : 0;
  if (op == "all_reduce" || op == "broadcast") return bytes / ts * ts;
  return bytes / ts / n * n * ts;
}

bool has_our_algorithm(const std::string& op) {
  return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter";
}

// The implementations of `op` to time: those asked for, where an op without ours runs as MPI's,
// once.
std::vector<CommAlgo> algos_of(const std::string& op, const std::vector<CommAlgo>& asked) {
  std::vector<CommAlgo> algos;
  for (CommAlgo a : asked) {
    if (!has_our_algorithm(op)) {
      if (a == CommAlgo::ours) continue;
      a = CommAlgo::mpi;
    }
    if (std::find(algos.begin(), algos.end(), a) == algos.end()) algos.push_back(a);
  }
  return algos;
}

}  // namespace

double busbw_factor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op == "all_reduce") return 2 * (n - 1) / n;
  if (op == "broadcast" || op == "send_recv") return 1;
  return (n - 1) / n;  // all_gather, reduce_scatter, all_to_all
}

std::vector<CommBenchRow> bench_comm(Group& g, const CommBenchOptions& o) {
  CLEAVE_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes && o.factor >= 2,
               "bench-comm: sizes " << o.min_bytes << ".." << o.max_bytes << " by x" << o.factor);
  Buffers buf;
  buf.a.resize(o.max_bytes);
  buf.b.resize(o.max_bytes);
  std::vector<CommBenchRow> rows;
  for (const std::string& op : o.ops) {
    for (CommType t : o.types) {
      const int64_t ts = int64_t(comm_detail::type_size(t));
      for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
        const int64_t bytes = actual_bytes(op, size, ts, g.size());
        if (bytes == 0) continue;
        for (CommAlgo algo : algos_of(op, o.algos)) {
          double last = 0;
          for (int i = 0; i < std::max(o.warmup, 1); ++i) {
            g.barrier().wait();
            const auto t0 = Clock::now();
            run(g, op, algo, t, size, buf);
            last = seconds_since(t0);
          }
          // The same iteration count on every rank: from the slowest rank's warm-up time.
          last = group_max(g, last);
          const int iters = int(std::clamp(o.seconds_per_case / std::max(last, 1e-7), 3.0, 50.0));
          std::vector<double> times;
          for (int i = 0; i < iters; ++i) {
            g.barrier().wait();
            const auto t0 = Clock::now();
            run(g, op, algo, t, size, buf);
            times.push_back(seconds_since(t0));
          }
          const double s = group_max(g, median(times));
          const double algbw = double(bytes) / s / 1e9;
          rows.push_back(
              {op, algo, t, bytes, iters, s, algbw, algbw * busbw_factor(op, g.size())});
        }
      }
    }
  }
  return rows;
}

namespace {

// A fixed amount of single-threaded floating-point work on an L1-resident array.
float compute(int64_t reps) {
  static float x[4096];
  float acc = 0;
  for (int64_t r = 0; r < reps; ++r) {
    for (int i = 0; i < 4096; ++i) x[i] = x[i] * 0.999f + 0.001f * float(i & 7);
    acc += x[r & 4095];
  }
  return acc;
}

// compute(reps)'s seconds: the fastest of 3 runs, so that a preemption (oversubscribed machines)
// does not shrink what is sized by it.
double compute_seconds(int64_t reps) {
  volatile float sink = 0;
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    sink = sink + compute(reps);
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The reps of compute that last about `seconds` on this rank.
int64_t reps_lasting(double seconds) {
  int64_t reps = 16;
  while (compute_seconds(reps) < 0.2 * seconds) reps *= 2;
  return int64_t(double(reps) * seconds / compute_seconds(reps)) + 1;
}

}  // namespace

OverlapResult measure_overlap(Group& g, int64_t bytes, CommAlgo algo) {
  Buffer<float> buf(bytes / 4);
  OverlapResult r{bytes, algo, 0, 0, 0, 0};
  std::vector<double> alone;
  for (int i = 0; i < 5; ++i) {
    g.barrier().wait();
    const auto t0 = Clock::now();
    g.all_reduce(buf.data(), buf.size(), CommType::f32, algo).wait();
    if (i >= 2) alone.push_back(seconds_since(t0));
  }
  r.comm_alone = group_max(g, median(alone));
  // The computation takes about twice the all_reduce.
  const int64_t reps = reps_lasting(2 * r.comm_alone);
  r.compute_alone = compute_seconds(reps);
  volatile float sink = 0;
  g.barrier().wait();
  const auto t1 = Clock::now();
  Work w = g.all_reduce(buf.data(), buf.size(), CommType::f32, algo);
  sink = sink + compute(reps);
  r.compute_with_comm = seconds_since(t1);
  r.waited = w.wait();
  (void)sink;
  return r;
}

MeetingResult measure_meetings(Group& g, double piece, double seconds) {
  // Every rank computes the same reps (rank 0's sizing), so the pieces differ by pace alone.
  int64_t reps = reps_lasting(piece);
  MPI_Bcast(&reps, 1, MPI_INT64_T, 0, g.comm());
  // MPI's meetings run on a communicator of their own, from this thread, while the progress
  // thread has nothing queued.
  MPI_Comm mine = MPI_COMM_NULL;
  comm_detail::check_mpi(MPI_Comm_dup(g.comm(), &mine), "MPI_Comm_dup (meetings)");
  std::array<double, 2> own{}, wall{};
  int64_t meetings = 0;
  float one = 0;
  volatile float sink = 0;
  g.barrier().wait();
  const auto start = Clock::now();
  for (bool more = true; more;) {
    for (int kind = 0; kind < 2; ++kind)
      for (int i = 0; i < 8; ++i) {
        const auto t0 = Clock::now();
        sink = sink + compute(reps);
        own[size_t(kind)] += seconds_since(t0);
        // Rank 0's clock decides when to stop, carried by the last meeting of a round.
        one = kind == 1 && i == 7 && g.rank() == 0 && seconds_since(start) >= seconds ? 1.0f : 0.0f;
        if (kind == 0) {
          g.all_reduce(&one, 1, CommType::f32).wait();
        } else {
          float sum = 0;
          comm_detail::check_mpi(MPI_Allreduce(&one, &sum, 1, MPI_FLOAT, MPI_SUM, mine),
                                 "MPI_Allreduce (meetings)");
          one = sum;
        }
        wall[size_t(kind)] += seconds_since(t0);
        if (kind == 1 && i == 7) more = one == 0;
      }
    meetings += 8;
  }
  comm_detail::check_mpi(MPI_Comm_free(&mine), "MPI_Comm_free (meetings)");
  (void)sink;
  MeetingResult r;
  r.meetings = meetings;
  const double n = double(meetings), ranks = double(g.size());
  const double ours_own = sum_of_doubles(g, own[0] / n) / ranks;
  const double mpi_own = sum_of_doubles(g, own[1] / n) / ranks;
  r.piece = (ours_own + mpi_own) / 2;
  r.ours_extra = wall[0] / n - ours_own;
  r.mpi_extra = wall[1] / n - mpi_own;
  return r;
}

}  // namespace cleave
