// The server under mpirun (docs/serving.md): rank 0 owns the socket and the scheduler, and every
// step's ragged batches go from it to every other rank. With ep, each ep rank is a lane that
// serves sequences of its own (attention data parallel over the ep ranks, tokens reaching their
// experts by all-to-all, as DeepSeek-V3 is served): a rank runs its lane's batch over its part of
// the model (its tp heads, its pp stage, its experts) and its own key/value pool, whose blocks
// rank 0's tables name, and the lanes' logits come back to rank 0 over its ep group. An idle
// server sends nothing: the other ranks wait for the next step sleeping, not spinning, and without
// the collectives' timeout (a server may be idle for days): only a step's head, the few bytes
// that say a step comes, goes by MPI itself (rank 0 holds its own send of it to the timeout: a
// stopped rank's full shared-memory queue can hold it back). The step's own transfers (its
// batches, its logits) go through the comm layer's groups and are held to its timeout like any
// collective: one that has not completed within it means a rank is stuck or gone, and the comm
// layer's report says which transfer on which group, with every rank's progress, and aborts the
// job.
#pragma once
#include <mpi.h>

#include "cleave/base/batch.h"
#include "cleave/comm/group.h"
#include "cleave/model/transformer.h"
#include "cleave/serve/engine.h"

namespace cleave::serve {

struct PeerGroups {
  MPI_Comm world = MPI_COMM_NULL;  // the heads (MPI_COMM_WORLD): waited for without a timeout
  Group* steps = nullptr;          // every rank: the steps' batches, from rank 0
  Group* ep = nullptr;  // this rank's ep group (its rank there is its lane); null without ep
  bool gathers = false;  // in rank 0's ep group: its lane's logits go to rank 0
  int vocab = 0;
  // Rank 0's own head broadcast: past this (parallel.comm_timeout_s) it reports and aborts the job.
  double timeout_seconds = 300;
};

// Rank 0's side.
class MpiPeers final : public Peers {
 public:
  explicit MpiPeers(const PeerGroups& groups) : groups_(groups) {}
  void send(const std::vector<Batch>& lanes) override;
  const float* gather(const float* own, const std::vector<Batch>& lanes) override;
  void stop();  // the other ranks return from follow_steps

 private:
  PeerGroups groups_;
  std::vector<float> logits_;
};

// Every other rank's: runs each step rank 0 sends until it sends stop. Its pool has as many
// blocks as rank 0's, of the same dtype.
void follow_steps(Transformer& model, int64_t kv_blocks, KvDtype kv_dtype, const PeerGroups& groups);

}  // namespace cleave::serve
