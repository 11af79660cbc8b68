#include "cleave/parallel/inference_layout.h"

#include <string>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"

namespace cleave {

namespace {
constexpr int kStageTag = 71;  // the activations between stages
}  // namespace

ModelChunk InferenceLayout::chunk(int stage) const { return stage_chunk(stage_layers, stage); }

InferenceLayout plan_inference(const ModelConfig& model, int tp, int pp, int ep, int world) {
  const int64_t ranks = int64_t(tp) * pp * ep;
  if (ranks != world)
    throw EveryRankError("the inference layout parallel.tp = " + std::to_string(tp) +
                         " x parallel.pp = " + std::to_string(pp) + " x parallel.ep = " +
                         std::to_string(ep) + " makes " + std::to_string(ranks) +
                         " ranks, but " + std::to_string(world) + " were started");
  if (ep > 1 && (model.moe_experts == 0 || model.moe_experts % ep != 0))
    throw EveryRankError("parallel.ep = " + std::to_string(ep) + " needs a mixture of experts " +
                         "whose experts it divides (model.moe_experts is " +
                         std::to_string(model.moe_experts) + ")");
  MeshDegrees degrees;
  degrees.pp = pp, degrees.dp_shard = ep, degrees.tp = tp;
  Schedule one_chunk_each;
  one_chunk_each.pp = pp, one_chunk_each.n_stages = pp;
  std::vector<int> layers;
  try {
    layers = stage_layers(ParallelConfig{}, one_chunk_each, model.n_layers);
  } catch (const Error& e) {  // every rank sees the same model and pp
    throw EveryRankError(e.what());
  }
  InferenceLayout out{Mesh(world, degrees), std::move(layers)};
  if (ep > 1) carve_ep(out.mesh, ep);
  return out;
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
