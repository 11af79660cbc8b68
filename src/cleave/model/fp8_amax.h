// Where FP8's "current" scales complete an amax (LinearGemm's AmaxReducer): the largest of the
// local values over the tp ranks, then over the cp ranks, either absent. A block's activations
// and gradients are spread over both (tp's split features, cp's sequence chunks); its weights
// and an expert's rows over tp only. Sequence parallelism needs nothing more: its rows are
// gathered before the products that read them.
#pragma once
#include <algorithm>
#include <vector>

#include "cleave/kernels/linear.h"
#include "cleave/model/cp_comm.h"
#include "cleave/model/tp_comm.h"

namespace cleave {

class GroupAmax : public AmaxReducer {
 public:
  GroupAmax(TpComm* tp, CpComm* cp) : tp_(tp), cp_(cp) {}
  float max(float local) override {
    if (tp_ && tp_->size() > 1) {
      all_.resize(size_t(tp_->size()));
      tp_->all_gather(&local, all_.data(), 1)();
      local = *std::max_element(all_.begin(), all_.end());
    }
    if (cp_ && cp_->size() > 1) {
      all_.resize(size_t(cp_->size()));
      cp_->all_gather(&local, all_.data(), 1)();
      local = *std::max_element(all_.begin(), all_.end());
    }
    return local;
  }

 private:
  TpComm* tp_;
  CpComm* cp_;
  std::vector<float> all_;
};

}  // namespace cleave
