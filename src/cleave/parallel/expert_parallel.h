// Expert parallelism's communication outside the model (docs/moe.md): the model's EpComm over the
// mesh's ep group, counting the bytes this rank sends and the seconds it waits, ep's exposed
// communication.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/model/ep_comm.h"

namespace cleave {

class GroupEpComm final : public EpComm {
 public:
  explicit GroupEpComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Wait all_to_all(const float* send, float* recv, int64_t n) override;
  Wait all_to_allv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                   const std::vector<int64_t>& recv_counts) override;
  double take_exposed_seconds() { return std::exchange(exposed_, 0.0); }
  // bytes this rank sent to other ranks of the group since the last call
  int64_t take_bytes() { return std::exchange(bytes_, int64_t(0)); }

 private:
  Group& group_;
  double exposed_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace cleave
