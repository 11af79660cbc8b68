// Pipeline parallelism at inference: how one stage's forward reaches the next. A stage receives
// the previous stage's output rows, sends its own to the next, and every stage gets the last
// stage's logits, so that every rank draws the same tokens. The layout's groups implement it
// (parallel/inference_layout.h); the model only calls it.
#pragma once
#include <cstdint>

namespace cleave {

class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual void receive(float* rows, int64_t n) = 0;     // from the previous stage
  virtual void send(const float* rows, int64_t n) = 0;  // to the next stage
  // In place: the last stage's n values on every stage.
  virtual void share_logits(float* logits, int64_t n) = 0;
};

}  // namespace cleave
