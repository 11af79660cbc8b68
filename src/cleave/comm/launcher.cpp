#include "cleave/comm/launcher.h"

#include <cstdlib>

namespace cleave {

Launcher launcher() {
  const bool slurm_step = std::getenv("SLURM_STEP_ID") != nullptr;
  const bool mpirun_rank = std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
  return slurm_step && !mpirun_rank ? Launcher::srun : Launcher::mpirun;
}

}  // namespace cleave
