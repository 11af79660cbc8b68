// Context parallelism's communication outside the model (docs/context_parallel.md): the model's
// CpComm over a Group of cp ranks (the ring's, the all-gather's or the Ulysses all-to-all's),
// counting the bytes this rank sends and the seconds it waits, cp's exposed communication.
#pragma once
#include <cstdint>

#include "cleave/comm/group.h"
#include "cleave/model/cp_comm.h"
#include "cleave/parallel/comm_meter.h"

namespace cleave {

class GroupCpComm final : public CpComm, public CommMeter {
 public:
  explicit GroupCpComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Wait all_gather(const float* send, float* recv, int64_t n) override;
  Wait reduce_scatter(const float* send, float* recv, int64_t n) override;
  Wait all_to_all(const float* send, float* recv, int64_t n) override;
  Wait ring_shift(const float* send, float* recv, int64_t n) override;

 private:
  Group& group_;
  int next_tag_ = 0;  // of the next ring shift: they count up (mod MPI's 32768), alike on every rank
};

}  // namespace cleave
