// Tensor parallelism's communication outside the model (docs/tensor_parallel.md): the model's
// TpComm over the mesh's tp group, the gradients that are pending sums over tp ranks (norm weights
// under sequence parallelism, replicated kv heads), and the gradient norm of a model whose
// tensors are split over, or replicated on, the tp ranks.
#pragma once
#include <cstdint>
#include <utility>
#include <memory>
#include <vector>

#include "cleave/comm/group.h"
#include "cleave/model/params.h"
#include "cleave/model/tp_share.h"
#include "cleave/parallel/comm_meter.h"

namespace cleave {

// TpComm over a Group: fp32 collectives by cleave's own algorithms; the seconds spent waiting
// are this axis's exposed communication.
class GroupTpComm final : public TpComm, public CommMeter {
 public:
  explicit GroupTpComm(Group& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Wait all_reduce(float* buf, int64_t n) override;
  Wait all_gather(const float* send, float* recv, int64_t n) override;
  Wait reduce_scatter(const float* send, float* recv, int64_t n) override;
  void check_replicated(const float* buf, int64_t n, const std::string& what) override;

 private:
  Group& group_;
};

// The sum of squares of the gradients of `ranges` (in grads) counting only the copies `copy`
// owns: each global element once over the tp ranks, and never a pipeline stage's tied copy.
double owned_sum_of_squares(const ParamStore& store, const std::vector<FlatRange>& ranges,
                            RangeBuffer grads, TpCopy copy);

class TensorParallelGrads {
 public:
  // kv_replicas: the tp ranks that share this rank's kv head (null when kv heads are split).
  TensorParallelGrads(ParamStore& store, GroupTpComm& tp, Group& tp_group,
                      GroupTpComm* kv_replicas);
  // After backward finished the tensors in the flat range [begin, end) (a unit): sums the
  // gradients that are pending sums over tp, or over the kv head's replicas, and waits.
  void reduce_partial(int64_t begin, int64_t end);
  // The sum of squares of the whole model's gradient from this rank's `ranges` (their gradients
  // in grads), counting each global element once: a replicated tensor on tp rank 0 only, a
  // replicated kv head on the first of its replicas. Summed over the tp group (the caller sums
  // over the data-parallel shards first, where they hold different elements).
  double owned_sum_of_squares(const std::vector<FlatRange>& ranges, RangeBuffer grads) const;
  double sum_over_tp(double local, double* waited);
  TpCopy copy() const { return {tp_group_.rank() == 0, !kv_ || kv_->rank() == 0}; }

 private:
  ParamStore& store_;
  GroupTpComm& tp_;
  Group& tp_group_;
  GroupTpComm* kv_;
};

}  // namespace cleave
