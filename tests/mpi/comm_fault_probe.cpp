// A small MPI program for integration/comm_fault_test.sh: all ranks loop over all_reduces of the
// world group; rank VICTIM misbehaves before collective #6:
//   comm_fault_probe ok    VICTIM TIMEOUT   nobody misbehaves (exit 0)
//   comm_fault_probe stall VICTIM TIMEOUT   the victim sleeps 60 s: the others time out
//   comm_fault_probe kill  VICTIM TIMEOUT   the victim kills itself with SIGKILL
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cleave/comm/group.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (argc != 4) {
    std::fprintf(stderr, "usage: comm_fault_probe ok|stall|kill VICTIM TIMEOUT_SECONDS\n");
    MPI_Finalize();
    return 2;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cleave::CommOptions options;
  options.timeout_seconds = std::atof(argv[3]);
  cleave::init_comm(options);
  {
    cleave::Group world(MPI_COMM_WORLD, "world");
    std::vector<float> buf(1 << 16, 1.0f);
    for (int i = 1; i <= 10; ++i) {
      if (rank == victim && i == 6 && mode == "stall") {
        std::fprintf(stderr, "probe: rank %d stalls before collective #%d\n", rank, i);
        sleep(60);
      }
      if (rank == victim && i == 6 && mode == "kill") {
        std::fprintf(stderr, "probe: rank %d kills itself before collective #%d\n", rank, i);
        raise(SIGKILL);
      }
      world.all_reduce(buf.data(), int64_t(buf.size()), cleave::CommType::f32).wait();
      usleep(20000);
    }
  }
  cleave::shutdown_comm();
  MPI_Finalize();
  if (rank == 0) std::printf("probe: done\n");
  return 0;
}
