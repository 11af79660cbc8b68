// The process groups of one rank: one per mesh axis, or set of axes, that a collective of the
// step runs on, every one a group of the mesh (whole or carved axes), so every rank builds the
// same groups in the same order (docs/architecture.md, Mesh).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/mesh/mesh.h"
#include "cleave/model/model_config.h"
#include "cleave/parallel/context_parallel.h"
#include "cleave/parallel/expert_parallel.h"
#include "cleave/parallel/tensor_parallel.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

struct ProcessGroups {
  // The group along `axes` (names of whole or carved axes, in mesh order): one of those below, or
  // made at its first request, which every rank must make alike (in the same order).
  Group* along(const std::vector<std::string>& axes);

  std::unique_ptr<Group> world;
  std::unique_ptr<Group> dp;         // dp_replicate x dp_shard: the batch's data-parallel ranks
  std::unique_ptr<Group> shard;      // dp_shard
  std::unique_ptr<Group> replicate;  // dp_replicate
  std::unique_ptr<Group> tp, pp;
  // The tp ranks whose query heads share one kv head (tp > n_kv_heads): the inner part of tp,
  // carved as kv_replicas. Null otherwise.
  std::unique_ptr<Group> kv;
  // The pipeline ranks of the first and the last stage, which hold GPT-2's tied embedding (pp > 1
  // and tied embeddings): null on the ranks between them.
  std::unique_ptr<Group> tied;
  std::unique_ptr<GroupTpComm> tp_comm, kv_comm;  // tp > 1; kv_comm with kv_replicas
  // Context parallelism (cp > 1): the cp group, and the groups attention exchanges over: the
  // ring (or all-gather) and the Ulysses all-to-all, the whole cp group or, in hybrid mode, the
  // carved cp_ring (outer) and cp_ulysses (inner) parts of it.
  std::unique_ptr<Group> cp;
  std::unique_ptr<GroupCpComm> cp_ring, cp_ulysses, cp_all;
  ContextParallelOptions context;
  // Expert parallelism (parallel.ep > 1): the ep group the tokens travel over.
  std::unique_ptr<GroupEpComm> ep_comm;

  const Mesh* mesh = nullptr;
  int rank = 0;
  std::map<std::vector<std::string>, Group*> by_axes;
  std::vector<std::unique_ptr<Group>> more;  // the groups along() made
};

// Collective over MPI_COMM_WORLD. Carves kv_replicas out of tp in `mesh` when the model needs it;
// in hybrid mode the mesh has cp_ulysses and cp_ring carved out of cp (plan_layout does it).
ProcessGroups make_process_groups(Mesh& mesh, int rank, const ModelConfig& model,
                                  const StageMap& stages, CpMode cp_mode = CpMode::ring);

}  // namespace cleave
