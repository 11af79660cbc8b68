#include "cleave/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace cleave {

bool weight_decay_applies(const ParamTensor& t, const std::vector<std::string>& no_decay) {
  if (t.shape.size() < 2) return false;
  for (auto& pattern : no_decay)
    if (t.name.find(pattern) != std::string::npos) return false;
  return true;
}

AdamW::AdamW(const ParamStore& store, const OptimConfig& cfg, std::vector<FlatRange> ranges)
    : cfg_(cfg), ranges_(std::move(ranges)) {
  pieces_ = tensor_pieces(store, ranges_);  // checks the ranges
  int64_t size = 0;
  for (const FlatRange& r : ranges_) size += r.end - r.begin;
  for (auto& t : store.tensors()) decay_.push_back(weight_decay_applies(t, cfg.no_decay));
  m_.resize(size);
  v_.resize(size);
}

void AdamW::step(RangeBuffer values, RangeBuffer grads, double lr, float grad_scale) {
  ++t_;
  const float b1 = float(cfg_.beta1), b2 = float(cfg_.beta2), eps = float(cfg_.eps);
  const float bc1 = float(1.0 - std::pow(cfg_.beta1, double(t_)));
  const float bc2 = float(1.0 - std::pow(cfg_.beta2, double(t_)));
  const float step_size = float(lr) / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  for (const TensorPiece& piece : pieces_) {
    float* p = piece.in(values);
    const float* g = piece.in(grads);
    float* m = m_.data() + piece.packed;
    float* v = v_.data() + piece.packed;
    const float decay = decay_[piece.tensor] ? 1.0f - float(lr * cfg_.weight_decay) : 1.0f;
    // Every multiply-add is an explicit fma, so the vectorised body and the scalar remainder
    // round alike wherever a piece starts (the compiler may not contract a product into an fma
    // call), and the result does not depend on how the flat range is cut into pieces.
#pragma omp parallel for simd schedule(static)
    for (int64_t j = 0; j < piece.end - piece.begin; ++j) {
      const float gj = g[j] * grad_scale;
      const float mj = std::fma(b1, m[j], (1.0f - b1) * gj);
      const float vj = std::fma(b2, v[j], ((1.0f - b2) * gj) * gj);
      m[j] = mj;
      v[j] = vj;
      const float update = step_size * mj / std::fma(std::sqrt(vj), inv_sqrt_bc2, eps);
      p[j] = std::fma(p[j], decay, -update);
    }
  }
}

}  // namespace cleave
