// Which program started this rank, so that advice about launching names that program's options.
#pragma once

namespace cleave {

enum class Launcher { mpirun, srun };

// srun's direct launch (`srun --mpi=pmix`) leaves SLURM_STEP_ID in each task's environment and
// none of the OMPI_COMM_WORLD_* variables mpirun gives its ranks. mpirun inside a Slurm allocation
// starts its daemons as srun's tasks, so its ranks have both: mpirun. Anything else (one process
// with no launcher, another MPI's launcher) counts as mpirun.
Launcher launcher();

}  // namespace cleave
