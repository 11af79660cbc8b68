#include "cleave/parallel/step_end.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace cleave {

void StepEnd::begin(int64_t step) {
  step_ = step;
  r_ = StepEndResult();
  shards_.assign(p_.groups.size(), {});
}

void StepEnd::finish_gradients() {
  for (size_t g = 0; g < p_.groups.size(); ++g) shards_[g] = p_.groups[g].dp->finish_gradients();
}

LossSum sum_losses(Group& batch, Group* pp, double loss_sum, double tokens, double* waited_pp) {
  LossSum s{sum_of_doubles(batch, loss_sum), sum_of_doubles(batch, tokens)};
  if (pp) {
    s.loss = sum_of_doubles(*pp, s.loss, waited_pp);
    s.tokens = sum_of_doubles(*pp, s.tokens, waited_pp);
  }
  return s;
}

void StepEnd::sum_loss(double loss_sum, double tokens, double expected) {
  const LossSum s =
      sum_losses(*p_.batch, p_.pp, loss_sum, tokens, &r_.comm[CommAxis::pp].exposed_s);
  CLEAVE_CHECK(s.tokens == expected, "step " << step_ + 1 << ": the ranks' batches hold "
                                             << s.tokens
                                             << " valid tokens; the gradients were scaled for "
                                             << expected);
  r_.loss = s.mean();
}

void StepEnd::grad_norm() {
  double& dp_wait = r_.comm[CommAxis::dp].exposed_s;
  double squares = 0;
  for (size_t g = 0; g < p_.groups.size(); ++g) {
    DataParallel& dp = *p_.groups[g].dp;
    double local = 0;
    if (!p_.tp_grads && !p_.pp) {
      local = dp.grad_sum_of_squares();
    } else {
      // Each global element once: sharded tensors from every tp rank, replicated ones from one,
      // a tied embedding from the stage that owns it.
      local = owned_sum_of_squares(*p_.params, dp.ranges(), shards_[g].grads,
                                   p_.tp_grads ? p_.tp_grads->copy() : TpCopy{});
      if (p_.zero_stage > 0)
        local = sum_of_doubles(*p_.groups[g].shard, local, &dp_wait);
    }
    if (p_.groups[g].spread) local = sum_of_doubles(*p_.groups[g].spread, local, &dp_wait);
    squares += local;
  }
  if (p_.tp_grads) squares = p_.tp_grads->sum_over_tp(squares, &r_.comm[CommAxis::tp].exposed_s);
  if (p_.pp) squares = sum_of_doubles(*p_.pp, squares, &r_.comm[CommAxis::pp].exposed_s);
  r_.grad_norm = std::sqrt(squares);
  // Both are the same on every rank, so every rank stops (or skips) here alike. The loss is
  // not scaled: a smaller scale cannot make a non-finite one finite.
  if (!std::isfinite(r_.loss)) stop_non_finite();
  if (p_.scaler) {
    r_.loss_scale = p_.scaler->scale();
    r_.skipped = !std::isfinite(r_.grad_norm);
    if (!p_.scaler->update(r_.skipped)) stop_non_finite();
    r_.grad_norm /= r_.loss_scale;
  }
  if (!std::isfinite(r_.grad_norm) && !r_.skipped) stop_non_finite();
}

void StepEnd::clip() {
  if (r_.skipped) return;
  r_.clip = p_.grad_clip > 0 && r_.grad_norm > p_.grad_clip ? p_.grad_clip / r_.grad_norm : 1.0;
}

void StepEnd::update(int group, double lr) {
  // With the whole update on every rank (DDP, or one process), AdamW has the store pack each
  // linear weight band by band as it writes it, from cache; under ZeRO the weights are packed at
  // their next product, once gathered.
  if (r_.skipped) return;
  const DataParallel::OptimizerInputs& shard = shards_[size_t(group)];
  p_.groups[size_t(group)].optim->step(shard.values, shard.grads, lr,
                                       float(r_.clip / r_.loss_scale));
}

void StepEnd::gather_parameters(int group) {
  if (!r_.skipped) p_.groups[size_t(group)].dp->after_optimizer_step();
}

void StepEnd::moe_stats() {
  moe_ = p_.model->take_moe_stats();
  std::vector<float> sums;
  for (const MoeLayerStats& s : moe_) {
    sums.insert(sums.end(), s.tokens.begin(), s.tokens.end());
    sums.insert(sums.end(), s.kept.begin(), s.kept.end());
    sums.insert(sums.end(), {float(s.dropped), float(s.aux), float(s.z)});
  }
  // Counts are whole numbers far below 2^24: exact in floats, and so the same on every rank.
  if (!sums.empty())
    p_.batch->all_reduce(sums.data(), int64_t(sums.size()), CommType::f32, CommAlgo::ours).wait();
  size_t at = 0;
  for (MoeLayerStats& s : moe_) {
    for (double& t : s.tokens) t = sums[at++];
    for (double& t : s.kept) t = sums[at++];
    s.dropped = sums[at++];
    s.aux = sums[at++];
    s.z = sums[at++];
    if (!r_.skipped) p_.model->update_moe_bias(s.layer, s.tokens);
  }
}

void StepEnd::fp8_scales() { p_.fp8->step_end(); }

void StepEnd::stop_non_finite() {
  // The first tensor (in the store's order) whose gradient this rank holds a non-finite value of;
  // the smallest over the batch's ranks is the first of the whole model.
  const float none = float(p_.params->tensors().size());
  float first = none;
  for (size_t g = 0; g < p_.groups.size(); ++g)
    for (const TensorPiece& piece : tensor_pieces(*p_.params, p_.groups[g].dp->ranges())) {
      if (float(piece.tensor) >= first) continue;
      const float* grad = piece.in(shards_[g].grads);
      for (int64_t i = 0; i < piece.end - piece.begin; ++i)
        if (!std::isfinite(grad[i])) {
          first = float(piece.tensor);
          break;
        }
    }
  std::vector<float> firsts(static_cast<size_t>(p_.batch->size()));
  p_.batch->all_gather(&first, firsts.data(), 1, CommType::f32, CommAlgo::ours).wait();
  const auto owner = std::min_element(firsts.begin(), firsts.end());
  const int tensor = int(*owner);
  // Its name as the rank holding it knows it: under ep a tensor index is another expert on each
  // ep rank, and only the owner's name (the global expert) is right.
  const int root = int(owner - firsts.begin());
  std::string name;
  if (float(tensor) < none)
    name = broadcast_string(
        *p_.batch, p_.batch->rank() == root ? p_.params->tensor(tensor).name : "", root);
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, "loss %g, gradient norm %g", r_.loss, r_.grad_norm);
  std::string what = "step " + std::to_string(step_ + 1) + ": " + numbers;
  if (p_.scaler && std::isfinite(r_.loss)) {
    std::snprintf(numbers, sizeof numbers, " at the smallest loss scale, %g", r_.loss_scale);
    what += numbers;
  }
  if (float(tensor) < none)
    what += "; the first parameter with a non-finite gradient is " +
            name;
  throw EveryRankError(what + ". Stopped before the update: the parameters and optimizer state "
                       "are those of step " + std::to_string(step_) +
                       ", and no checkpoint of this step was written");
}

}  // namespace cleave
