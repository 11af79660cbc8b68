// A small MPI program for integration/comm_fault_test.sh: all ranks loop over all_reduces of the
// world group; rank VICTIM misbehaves before collective #6:
//   comm_fault_probe ok       VICTIM TIMEOUT [STATUS_DIR]   nobody misbehaves (exit 0)
//   comm_fault_probe stall    VICTIM TIMEOUT [STATUS_DIR]   the victim sleeps 60 s: the others time out
//   comm_fault_probe stall-gather ...                        the same, collective #6 a gatherv to rank 0
//   comm_fault_probe kill     VICTIM TIMEOUT [STATUS_DIR]   the victim kills itself with SIGKILL
//   comm_fault_probe fail     VICTIM TIMEOUT [STATUS_DIR]   the victim throws an error of its own
//   comm_fault_probe fail-all VICTIM TIMEOUT [STATUS_DIR]   every rank throws an EveryRankError
// Errors end the probe as they end cleave (report_error). Every rank prints the wall-clock time at
// which it reaches collective #6, so that the test can time a fault from its start.
#include <mpi.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/group.h"

namespace {

double wall_seconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void run(const std::string& mode, int victim, int rank) {
  cleave::Group world(MPI_COMM_WORLD, "world");
  std::vector<float> buf(1 << 16, 1.0f);
  for (int i = 1; i <= 10; ++i) {
    if (i == 6) std::fprintf(stderr, "probe: rank %d at collective #6 at %.3f\n", rank, wall_seconds());
    if (i == 6 && mode == "fail-all") throw cleave::EveryRankError("probe: every rank fails alike");
    if (rank == victim && i == 6 && (mode == "stall" || mode == "stall-gather")) {
      std::fprintf(stderr, "probe: rank %d stalls before collective #%d\n", rank, i);
      sleep(60);
    }
    if (rank == victim && i == 6 && mode == "kill") {
      std::fprintf(stderr, "probe: rank %d kills itself before collective #%d\n", rank, i);
      raise(SIGKILL);
    }
    if (rank == victim && i == 6 && mode == "fail")
      throw cleave::Error("probe: rank " + std::to_string(rank) + " fails alone");
    if (i == 6 && mode == "stall-gather") {
      // As cleave serve gathers its lanes' logit rows at rank 0: a gatherv of uneven counts.
      std::vector<int64_t> counts;
      for (int r = 0; r < world.size(); ++r) counts.push_back(100 * (r + 1));
      std::vector<float> all(rank == 0 ? size_t(100 * world.size() * (world.size() + 1) / 2) : 0);
      world.gatherv(buf.data(), counts[size_t(rank)], rank == 0 ? all.data() : nullptr, counts,
                    cleave::CommType::f32, 0).wait();
    } else {
      world.all_reduce(buf.data(), int64_t(buf.size()), cleave::CommType::f32).wait();
    }
    usleep(20000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: comm_fault_probe ok|stall|stall-gather|kill|fail|fail-all VICTIM TIMEOUT_SECONDS "
                 "[STATUS_DIR]\n");
    MPI_Finalize();
    return 2;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cleave::CommOptions options;
  options.timeout_seconds = std::atof(argv[3]);
  if (argc == 5) options.status_dir = argv[4];
  cleave::init_comm(options);
  int rc = 0;
  try {
    run(mode, victim, rank);
  } catch (const std::exception& e) {
    rc = cleave::report_error(e);
  }
  cleave::shutdown_comm();
  MPI_Finalize();
  if (rank == 0 && rc == 0) std::printf("probe: done\n");
  return rc;
}
