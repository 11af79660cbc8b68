// The layout inference runs in (docs/inference.md): pp x ep x tp ranks. Each pp rank holds one
// stage of consecutive layers (balanced as training's default, the earlier stages taking any
// remainder). The ep ranks (the mesh's dp_shard, carved as ep) hold the dense weights each and
// E / ep of every MoE layer's experts, and take their share of the sequences: attention is data
// parallel over them and tokens reach their experts by all-to-all, as DeepSeek-V3 is served.
// And the link between the stages over the pp group.
#pragma once
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/mesh/mesh.h"
#include "cleave/model/model_config.h"
#include "cleave/model/stage_link.h"
#include "cleave/model/transformer.h"

namespace cleave {

struct InferenceLayout {
  Mesh mesh;
  std::vector<int> stage_layers;  // per stage
  // The layers, embeddings and head of pp rank `stage`.
  ModelChunk chunk(int stage) const;
};

// Throws, naming the figures, where tp x pp x ep is not the world, pp exceeds the layers, or ep
// does not divide the experts.
InferenceLayout plan_inference(const ModelConfig& model, int tp, int pp, int ep, int world);

// Point-to-point to the neighbouring stages, and the logits broadcast from the last, over the pp
// group (pp rank = stage).
class GroupStageLink final : public StageLink {
 public:
  explicit GroupStageLink(Group& pp) : pp_(pp) {}
  void receive(float* rows, int64_t n) override;
  void send(const float* rows, int64_t n) override;
  void share_logits(float* logits, int64_t n) override;

 private:
  Group& pp_;
};

}  // namespace cleave
