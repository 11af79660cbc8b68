// Which launcher started the rank, told from the environment each one leaves (OpenMPI 4.1's
// mpirun, Slurm's srun), without MPI.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cleave/comm/launcher.h"

namespace cleave {
namespace {

void set(const char* name, const char* value) {
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

Launcher launched_with(const char* slurm_step_id, const char* ompi_rank) {
  set("SLURM_STEP_ID", slurm_step_id);
  set("OMPI_COMM_WORLD_RANK", ompi_rank);
  return launcher();
}

TEST(CommLauncher, SrunsDirectLaunch) { EXPECT_EQ(launched_with("0", nullptr), Launcher::srun); }

TEST(CommLauncher, MpirunAlsoInsideASlurmAllocation) {
  EXPECT_EQ(launched_with(nullptr, "3"), Launcher::mpirun);
  EXPECT_EQ(launched_with("0", "3"), Launcher::mpirun);
}

TEST(CommLauncher, NoLauncherCountsAsMpirun) {
  EXPECT_EQ(launched_with(nullptr, nullptr), Launcher::mpirun);
}

}  // namespace
}  // namespace cleave
