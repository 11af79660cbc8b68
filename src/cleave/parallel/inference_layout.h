// The layout inference runs in (docs/inference.md): tp x pp ranks, pp outer, each pp rank one
// stage of consecutive layers (balanced as training's default, the earlier stages taking any
// remainder), and the link between the stages over the pp group.
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

// Throws, naming the figures, where tp x pp is not the world or pp exceeds the layers.
InferenceLayout plan_inference(const ModelConfig& model, int tp, int pp, int world);

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
