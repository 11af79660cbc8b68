#include "cleave/parallel/process_groups.h"

#include <algorithm>
#include <vector>

#include "cleave/parallel/mesh_groups.h"

namespace cleave {

Group* ProcessGroups::along(const std::vector<std::string>& axes) {
  Group*& group = by_axes[axes];
  if (group) return group;
  std::string name;
  for (const std::string& a : axes) name += (name.empty() ? "" : " x ") + a;
  more.push_back(make_group(mesh->group(rank, axes), rank, name));
  return group = more.back().get();
}

ProcessGroups make_process_groups(Mesh& mesh, int rank, const ModelConfig& model,
                                  const StageMap& stages, CpMode cp_mode) {
  ProcessGroups g;
  g.mesh = &mesh;
  g.rank = rank;
  g.world = make_group(mesh, rank, {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp,
                                    Axis::tp}, "world");
  g.dp = make_group(mesh, rank, {Axis::dp_replicate, Axis::dp_shard}, "dp");
  g.shard = make_group(mesh, rank, {Axis::dp_shard}, "dp_shard");
  g.replicate = make_group(mesh, rank, {Axis::dp_replicate}, "dp_replicate");
  g.tp = make_group(mesh, rank, {Axis::tp}, "tp");
  g.pp = make_group(mesh, rank, {Axis::pp}, "pp");
  g.by_axes = {{{"pp", "dp_replicate", "dp_shard", "cp", "tp"}, g.world.get()},
               {{"dp_replicate", "dp_shard"}, g.dp.get()},
               {{"dp_shard"}, g.shard.get()},
               {{"dp_replicate"}, g.replicate.get()},
               {{"tp"}, g.tp.get()},
               {{"pp"}, g.pp.get()}};

  const int tp = mesh.degree(Axis::tp);
  if (tp > 1) {
    g.tp_comm = std::make_unique<GroupTpComm>(*g.tp);
    if (tp_share(model, tp, g.tp->rank()).kv_replicated) {
      // Rank r's kv head is r / (tp / n_kv_heads): consecutive tp ranks share one.
      mesh.carve(kKvReplicasAxis, tp / model.n_kv_heads, {Axis::tp}, "kv_heads");
      g.kv = make_group(mesh.group(rank, {kKvReplicasAxis}), rank, "tp_kv");
      g.kv_comm = std::make_unique<GroupTpComm>(*g.kv);
    }
  }
  const int cp = mesh.degree(Axis::cp);
  if (cp > 1) {
    g.cp = make_group(mesh, rank, {Axis::cp}, "cp");
    g.by_axes[{"cp"}] = g.cp.get();
    ContextParallelOptions& c = g.context;
    c.mode = cp_mode;
    c.cp = cp;
    c.cp_rank = g.cp->rank();
    if (cp_mode == CpMode::hybrid) {
      g.cp_ring = std::make_unique<GroupCpComm>(*g.along({kCpRingAxis}));
      g.cp_ulysses = std::make_unique<GroupCpComm>(*g.along({kCpUlyssesAxis}));
    } else if (cp_mode == CpMode::ulysses) {
      g.cp_ulysses = std::make_unique<GroupCpComm>(*g.cp);
    } else {
      g.cp_ring = std::make_unique<GroupCpComm>(*g.cp);
    }
    c.ring = g.cp_ring.get();
    c.ulysses = g.cp_ulysses.get();
    g.cp_all = std::make_unique<GroupCpComm>(*g.cp);
    c.group = g.cp_all.get();
  }
  for (const CarvedAxis& c : mesh.carved())
    if (c.name == kEp) g.ep_comm = std::make_unique<GroupEpComm>(*g.along({kEp}));
  const int pp = mesh.degree(Axis::pp);
  if (pp > 1 && model.tie_embeddings) {
    // The first and last stage's ranks of this rank's pipeline; none when a V schedule puts both
    // ends on one rank, which then holds a single tensor.
    const std::vector<int> pipeline = mesh.group(rank, Axis::pp);
    std::vector<int> ends = {pipeline[size_t(stages.rank_of_stage.front())],
                             pipeline[size_t(stages.rank_of_stage.back())]};
    std::sort(ends.begin(), ends.end());
    if (ends[0] == ends[1] || std::find(ends.begin(), ends.end(), rank) == ends.end()) ends.clear();
    g.tied = make_group(ends, rank, "pp_tied");
  }
  return g;
}

}  // namespace cleave
