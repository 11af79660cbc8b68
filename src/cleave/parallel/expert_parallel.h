// Expert parallelism's communication outside the model (docs/moe.md): the model's EpComm over the
// mesh's ep group, counting the bytes this rank sends and the seconds it waits, ep's exposed
// communication.
#pragma once
#include <cstdint>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/model/ep_comm.h"
#include "cleave/parallel/comm_meter.h"

namespace cleave {

class GroupEpComm final : public EpComm, public CommMeter {
 public:
  explicit GroupEpComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Wait all_to_all(const float* send, float* recv, int64_t n) override;
  Wait all_to_allv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                   const std::vector<int64_t>& recv_counts) override;

 private:
  Group& group_;
};

}  // namespace cleave
