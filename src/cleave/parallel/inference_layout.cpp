#include "cleave/parallel/inference_layout.h"

#include <string>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"

namespace cleave {

namespace {
constexpr int kStageTag = 71;  // the activations between stages
}  // namespace

ModelChunk InferenceLayout::chunk(int stage) const {
  int first = 0;
  for (int s = 0; s < stage; ++s) first += stage_layers[size_t(s)];
  const int last = int(stage_layers.size()) - 1;
  return {first, first + stage_layers[size_t(stage)], stage == 0, stage == last};
}

InferenceLayout plan_inference(const ModelConfig& model, int tp, int pp, int world) {
  if (tp * pp != world)
    throw EveryRankError("the inference layout parallel.tp = " + std::to_string(tp) +
                         " x parallel.pp = " + std::to_string(pp) + " makes " +
                         std::to_string(tp * pp) + " ranks, but " + std::to_string(world) +
                         " were started");
  MeshDegrees degrees;
  degrees.pp = pp, degrees.tp = tp;
  Schedule one_chunk_each;
  one_chunk_each.pp = pp, one_chunk_each.n_stages = pp;
  return {Mesh(world, degrees), stage_layers(ParallelConfig{}, one_chunk_each, model.n_layers)};
}

void GroupStageLink::receive(float* rows, int64_t n) {
  pp_.recv(rows, n, CommType::f32, pp_.rank() - 1, kStageTag).wait();
}

void GroupStageLink::send(const float* rows, int64_t n) {
  pp_.send(rows, n, CommType::f32, pp_.rank() + 1, kStageTag).wait();
}

void GroupStageLink::share_logits(float* logits, int64_t n) {
  pp_.broadcast(logits, n, CommType::f32, pp_.size() - 1).wait();
}

}  // namespace cleave
