#include "cleave/parallel/fp8_scaling.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "cleave/base/check.h"

namespace cleave {

namespace {

kernels::Fp8Format format_of(int operand) {
  return operand == fp8_dy ? kernels::Fp8Format::e5m2 : kernels::Fp8Format::e4m3;
}

}  // namespace

Fp8Scaling::Fp8Scaling(Group& world, std::vector<std::pair<std::string, LinearGemm*>> gemms,
                       const Fp8Options& options)
    : world_(world), options_(options) {
  nlohmann::json mine = nlohmann::json::array();
  for (auto& [name, gemm] : gemms) mine.push_back(name);
  std::string all;
  if (world.rank() == 0) {
    std::set<std::string> every;
    for (const std::string& list : gather_strings(mine.dump(), 0, world.size()))
      for (const auto& name : nlohmann::json::parse(list)) every.insert(name.get<std::string>());
    all = nlohmann::json(std::vector<std::string>(every.begin(), every.end())).dump();
  } else {
    gather_strings(mine.dump(), world.rank(), world.size());
  }
  names_ = nlohmann::json::parse(broadcast_string(world, all)).get<std::vector<std::string>>();
  for (auto& [name, gemm] : gemms) {
    const auto at = std::lower_bound(names_.begin(), names_.end(), name);
    mine_.push_back({int(at - names_.begin()), gemm});
  }
  scales_.assign(3 * names_.size(), 1.0f);
  weight_amax_.assign(names_.size(), 0.0f);
  if (delayed()) apply_scales();
}

void Fp8Scaling::step_end() {
  const size_t n = 3 * names_.size();
  if (!delayed()) {
    std::vector<float> local(n, 0.0f);
    for (auto& [slot, gemm] : mine_) {
      const Fp8Triple s = gemm->fp8_scales();
      for (int k = 0; k < 3; ++k) local[3 * size_t(slot) + size_t(k)] = s[size_t(k)];
    }
    scales_ = max_over(world_, local);
    return;
  }
  std::vector<float> local(n, 0.0f);
  for (auto& [slot, gemm] : mine_) {
    const Fp8Triple a = gemm->take_fp8_amax();
    for (int k = 0; k < 3; ++k) local[3 * size_t(slot) + size_t(k)] = a[size_t(k)];
    float& w = local[3 * size_t(slot) + fp8_w];
    w = std::max(w, std::exchange(weight_amax_[size_t(slot)], 0.0f));
  }
  history_.push_back(max_over(world_, local));
  if (int64_t(history_.size()) > options_.amax_history_len) history_.erase(history_.begin());
  for (size_t i = 0; i < n; ++i) {
    float a = history_.back()[i];
    if (!options_.amax_most_recent)
      for (const auto& step : history_) a = std::max(a, step[i]);
    scales_[i] = kernels::fp8_scale(a, format_of(int(i % 3)), options_.margin, scales_[i]);
  }
  apply_scales();
}

void Fp8Scaling::discard() {
  if (!delayed()) return;
  for (auto& [slot, gemm] : mine_) {
    float& w = weight_amax_[size_t(slot)];
    w = std::max(w, gemm->take_fp8_amax()[fp8_w]);
  }
}

void Fp8Scaling::apply_scales() {
  for (auto& [slot, gemm] : mine_) {
    const size_t at = 3 * size_t(slot);
    gemm->set_fp8_scales({scales_[at], scales_[at + 1], scales_[at + 2]});
  }
}

Fp8ScalingState Fp8Scaling::state() const {
  Fp8ScalingState out{delayed(), names_, scales_, {}};
  if (delayed())
    for (const auto& step : history_) out.history.insert(out.history.end(), step.begin(), step.end());
  return out;
}

void Fp8Scaling::restore(const Fp8ScalingState& state, const std::string& where) {
  CLEAVE_CHECK(state.names == names_,
               where << ": the FP8 state holds " << state.names.size()
                     << " linears, not this model's " << names_.size() << " (or other names)");
  CLEAVE_CHECK(state.scales.size() == 3 * names_.size() &&
                   state.history.size() == size_t(state.steps()) * 3 * names_.size(),
               where << ": the FP8 state's scales or history do not have 3 values per linear");
  scales_ = state.scales;
  history_.clear();
  const size_t n = 3 * names_.size();
  for (int64_t i = 0; i < state.steps(); ++i)
    history_.emplace_back(state.history.begin() + ptrdiff_t(i * n),
                          state.history.begin() + ptrdiff_t((i + 1) * n));
  while (int64_t(history_.size()) > options_.amax_history_len) history_.erase(history_.begin());
  apply_scales();
}

}  // namespace cleave
