// The server under mpirun (docs/serving.md): rank 0 owns the socket and the scheduler, and every
// step's ragged batch goes from it to every other rank, which runs the same forward over its part
// of the model (its tp heads, its pp stage) and its own key/value pool, whose blocks rank 0's
// tables name. An idle server sends nothing: the other ranks wait for the next step sleeping, not
// spinning, and without the collectives' timeout (a server may be idle for days).
#pragma once
#include <mpi.h>

#include "cleave/base/batch.h"
#include "cleave/model/transformer.h"

namespace cleave::serve {

// Rank 0's side.
void send_step(const Batch& batch, MPI_Comm comm);
void send_stop(MPI_Comm comm);
// Every other rank's: runs each step rank 0 sends until it sends stop. Its pool has as many
// blocks as rank 0's.
void follow_steps(Transformer& model, int64_t kv_blocks, MPI_Comm comm);

}  // namespace cleave::serve
