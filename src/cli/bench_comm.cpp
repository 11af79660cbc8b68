// cleave bench-comm: algbw/busbw of every collective, cleave's implementation beside MPI's,
// whether an all_reduce overlaps computation, and what a meeting at a small collective between
// short computations costs with cleave's wait and with MPI's own. Run under mpirun.
#include <mpi.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "cleave/comm/comm_bench.h"
#include "cleave/comm/errors.h"
#include "cli/args.h"

namespace cleave::cli {

namespace {

std::string human(int64_t b) {
  char s[32];
  const double mib = double(b) / (1 << 20), kib = double(b) / 1024;
  if (b >= (int64_t(1) << 20)) std::snprintf(s, sizeof(s), b % (1 << 20) ? "%.2f MiB" : "%.0f MiB", mib);
  else if (b >= 1024) std::snprintf(s, sizeof(s), b % 1024 ? "%.2f KiB" : "%.0f KiB", kib);
  else std::snprintf(s, sizeof(s), "%lld B", (long long)b);
  return s;
}

}  // namespace

int bench_comm(int argc, char** argv) {
  Args a;
  CommBenchOptions o;
  int64_t overlap_bytes = 0;
  double meeting_seconds = 2;
  // Every rank reads the same command line: an error in it is agreed on and reported once.
  agree_on_errors([&] {
    a = Args::parse("bench-comm", argc, argv,
                    {"--min-bytes", "--max-bytes", "--factor", "--ops", "--type", "--seconds",
                     "--overlap-bytes", "--meeting-seconds"},
                    {"--no-overlap", "--no-meetings", "--meetings-only"});
    if (a.has("--meetings-only") && a.has("--no-meetings"))
      throw Error("bench-comm: --meetings-only and --no-meetings exclude each other");
    // An option of a part that does not run would be read and ignored.
    if (a.has("--meetings-only"))
      for (const char* k : {"--min-bytes", "--max-bytes", "--factor", "--ops", "--type", "--seconds",
                            "--overlap-bytes", "--no-overlap"})
        if (a.has(k)) throw Error(std::string("bench-comm: ") + k + " has no effect with --meetings-only");
    if (a.has("--no-meetings") && a.has("--meeting-seconds"))
      throw Error("bench-comm: --meeting-seconds has no effect with --no-meetings");
    o.min_bytes = a.integer("--min-bytes", o.min_bytes, 1, int64_t(1) << 40);
    o.max_bytes = a.integer("--max-bytes", o.max_bytes, o.min_bytes, int64_t(1) << 40);
    o.factor = int(a.integer("--factor", o.factor, 2, 1024));
    o.seconds_per_case = a.number("--seconds", o.seconds_per_case);
    if (a.has("--ops")) {
      o.ops.clear();
      std::stringstream ss(a.get("--ops", ""));
      for (std::string op; std::getline(ss, op, ',');) o.ops.push_back(op);
    }
    const std::string type = a.get("--type", "f32");
    if (type == "f32") o.types = {CommType::f32};
    else if (type == "bf16") o.types = {CommType::bf16};
    else if (type == "both") o.types = {CommType::f32, CommType::bf16};
    else throw Error("bench-comm: --type expects f32, bf16 or both, got '" + type + "'");
    overlap_bytes = a.integer("--overlap-bytes", 16 << 20, 0, int64_t(1) << 40);
    meeting_seconds = a.number_in("--meeting-seconds", meeting_seconds, 1e-3, 3600);
  });

  init_comm(CommOptions{});
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Group world(MPI_COMM_WORLD, "world");
  const bool meetings_only = a.has("--meetings-only");
  if (rank == 0 && !meetings_only)
    std::printf("bench-comm: %d ranks; time: median over iterations of the slowest rank; GB/s as "
                "nccl-tests defines them\n(algbw = size / time; busbw = algbw * 2(n-1)/n for "
                "all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all, 1 for broadcast and "
                "send_recv)\n\n",
                world.size());
  const auto rows = meetings_only ? std::vector<CommBenchRow>{} : bench_comm(world, o);
  if (rank == 0 && !meetings_only) {
    std::printf("%-15s %-5s %10s | %12s %7s %7s | %12s %7s %7s | %s\n", "op", "type", "size",
                "ours: us", "algbw", "busbw", "mpi: us", "algbw", "busbw", "faster");
    // rows come as (ours, mpi) pairs per size, or mpi alone
    std::map<std::tuple<std::string, int, int64_t>, const CommBenchRow*> ours;
    for (const CommBenchRow& r : rows)
      if (r.algo == CommAlgo::ours) ours[{r.op, int(r.type), r.bytes}] = &r;
    for (const CommBenchRow& r : rows) {
      if (r.algo != CommAlgo::mpi) continue;
      auto it = ours.find({r.op, int(r.type), r.bytes});
      const CommBenchRow* u = it == ours.end() ? nullptr : it->second;
      char left[64] = "           -       -       -";
      if (u) std::snprintf(left, sizeof(left), "%12.1f %7.2f %7.2f", u->seconds * 1e6, u->algbw, u->busbw);
      std::printf("%-15s %-5s %10s | %s | %12.1f %7.2f %7.2f | %s\n", r.op.c_str(),
                  r.type == CommType::f32 ? "f32" : "bf16", human(r.bytes).c_str(), left,
                  r.seconds * 1e6, r.algbw, r.busbw,
                  !u ? "mpi" : u->seconds < r.seconds ? "ours" : "mpi");
    }
    std::fflush(stdout);
  }
  if (!a.has("--no-overlap") && !meetings_only) {
    const int64_t bytes = overlap_bytes;
    for (CommAlgo algo : {CommAlgo::ours, CommAlgo::mpi}) {
      const OverlapResult r = measure_overlap(world, bytes, algo);
      if (rank == 0)
        std::printf("\noverlap, all_reduce %s (%s) while rank 0 computes on its main thread:\n"
                    "  all_reduce alone %.2f ms; computation alone %.2f ms, with the all_reduce "
                    "running %.2f ms; then wait() blocked %.2f ms\n",
                    human(bytes).c_str(), algo == CommAlgo::ours ? "ours" : "mpi",
                    r.comm_alone * 1e3, r.compute_alone * 1e3, r.compute_with_comm * 1e3,
                    r.waited * 1e3);
    }
  }
  if (!a.has("--no-meetings")) {
    if (rank == 0)
      std::printf("\nmeetings: a one-float all_reduce after each piece of single-threaded "
                  "computation,\nthrough cleave's progress thread (this thread blocked in "
                  "Work::wait) and by MPI_Allreduce\ncalled from this thread (MPI's own wait), "
                  "alternating in runs of 8 for %.3g s per piece;\nextra: the wall time per "
                  "meeting beyond the ranks' mean time for the piece\n%10s %10s %16s %16s %8s\n",
                  meeting_seconds, "piece ms", "meetings", "cleave: extra ms", "MPI: extra ms",
                  "ratio");
    for (double piece : {0.25e-3, 1e-3, 4e-3}) {
      const MeetingResult r = measure_meetings(world, piece, meeting_seconds);
      if (rank == 0)
        std::printf("%10.3f %10lld %16.3f %16.3f %7.2fx\n", r.piece * 1e3, (long long)r.meetings,
                    r.ours_extra * 1e3, r.mpi_extra * 1e3,
                    r.mpi_extra > 0 ? r.ours_extra / r.mpi_extra : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace cleave::cli
