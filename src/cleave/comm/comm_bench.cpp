// bench-comm. Each case: `warmup` untimed calls (they also grow the persistent buffers), then
// iterations of barrier + timed call; every rank takes its median, the slowest rank's median counts.
//
// Results on the development machine (2-core AMD EPYC VM shared with other jobs, OpenMPI 4.1.4,
// vader shared memory, mpirun -np 2, fp32; busbw in GB/s, ours / MPI) -- the basis of the decision
// table in group.cpp:
//   (filled in from the measurements)
#include "cleave/comm/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"

namespace cleave {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
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

// Issues one call of `op` of nccl-tests size `bytes` on the buffers.
Work issue(Group& g, const std::string& op, CommAlgo algo, CommType t, int64_t bytes, Buffers& buf) {
  const int64_t ts = t == CommType::f32 ? 4 : 2, n = g.size();
  if (op == "all_reduce") return g.all_reduce(buf.a.data(), bytes / ts, t, algo);
  if (op == "broadcast") return g.broadcast(buf.a.data(), bytes / ts, t, 0);
  const int64_t per_rank = bytes / ts / n;
  if (op == "all_gather")
    return g.all_gather(buf.a.data(), buf.b.data(), per_rank, t, algo);
  if (op == "reduce_scatter")
    return g.reduce_scatter(buf.a.data(), buf.b.data(), per_rank, t, algo);
  if (op == "all_to_all") return g.all_to_all(buf.a.data(), buf.b.data(), per_rank, t);
  CLEAVE_FAIL("bench-comm: unknown collective '" << op << "'");
}

// The size bench-comm reports for `bytes` requested (whole elements per rank).
int64_t actual_bytes(const std::string& op, int64_t bytes, int64_t ts, int64_t n) {
  if (op == "all_reduce" || op == "broadcast") return bytes / ts * ts;
  return bytes / ts / n * n * ts;
}

bool has_our_algorithm(const std::string& op) {
  return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter";
}

}  // namespace

double busbw_factor(const std::string& op, int ranks) {
  const double n = ranks;
  if (op == "all_reduce") return 2 * (n - 1) / n;
  if (op == "broadcast") return 1;
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
      const int64_t ts = t == CommType::f32 ? 4 : 2;
      for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
        const int64_t bytes = actual_bytes(op, size, ts, g.size());
        if (bytes == 0) continue;
        for (CommAlgo algo : {CommAlgo::ours, CommAlgo::mpi}) {
          if (algo == CommAlgo::ours && !has_our_algorithm(op)) continue;
          double last = 0;
          for (int i = 0; i < std::max(o.warmup, 1); ++i) {
            g.barrier().wait();
            const auto t0 = Clock::now();
            issue(g, op, algo, t, size, buf).wait();
            last = seconds_since(t0);
          }
          // The same iteration count on every rank: from the slowest rank's warm-up time.
          last = group_max(g, last);
          const int iters = int(std::clamp(o.seconds_per_case / std::max(last, 1e-7), 3.0, 50.0));
          std::vector<double> times;
          for (int i = 0; i < iters; ++i) {
            g.barrier().wait();
            const auto t0 = Clock::now();
            issue(g, op, algo, t, size, buf).wait();
            times.push_back(seconds_since(t0));
          }
          const double s = group_max(g, median(times));
          const double algbw = double(bytes) / s / 1e9;
          rows.push_back({op, algo, t, bytes, iters, s, algbw, algbw * busbw_factor(op, g.size())});
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
  // Calibrate the computation to take about twice the all_reduce.
  int64_t reps = 16;
  volatile float sink = 0;
  for (;;) {
    const auto t0 = Clock::now();
    sink = sink + compute(reps);
    const double s = seconds_since(t0);
    if (s > 0.2 * r.comm_alone) {
      reps = int64_t(double(reps) * 2 * r.comm_alone / s) + 1;
      break;
    }
    reps *= 2;
  }
  const auto t0 = Clock::now();
  sink = sink + compute(reps);
  r.compute_alone = seconds_since(t0);
  g.barrier().wait();
  const auto t1 = Clock::now();
  Work w = g.all_reduce(buf.data(), buf.size(), CommType::f32, algo);
  sink = sink + compute(reps);
  r.compute_with_comm = seconds_since(t1);
  r.waited = w.wait();
  (void)sink;
  return r;
}

}  // namespace cleave
