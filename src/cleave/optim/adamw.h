// AdamW (Loshchilov & Hutter) with decoupled weight decay, fused in one pass over the flat
// parameter, gradient and moment buffers: gradient clipping's scale is applied in the same pass.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/model/params.h"
#include "cleave/train/config.h"

namespace cleave {

class AdamW {
 public:
  // State for the flat parameter range [begin, end): the whole store, or this rank's shard when
  // the optimizer state is sharded (ZeRO).
  AdamW(const ParamStore& store, const OptimConfig& cfg, int64_t begin, int64_t end);

  // One update of the values in [begin, end) with learning rate lr, from `grads` (the gradients
  // of that range, multiplied by grad_scale first).
  void step(ParamStore& store, const float* grads, double lr, float grad_scale);
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

  bool decays(int tensor) const { return decay_[tensor]; }
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  Buffer<float>& m() { return m_; }
  Buffer<float>& v() { return v_; }

 private:
  OptimConfig cfg_;
  std::vector<bool> decay_;
  int64_t begin_, end_;
  Buffer<float> m_, v_;  // [end - begin]
  int64_t t_ = 0;
};

// The decay rule: tensors of two or more dimensions decay unless their name contains one of
// `no_decay`; vectors (norm weights, biases) never decay.
bool decays(const ParamTensor& t, const std::vector<std::string>& no_decay);

}  // namespace cleave
