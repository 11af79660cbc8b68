// Expert parallelism as the model sees it (docs/moe.md): a MoE layer's experts are split over the
// ep ranks, and tokens travel to their experts' ranks and back by all-to-all(v). An interface, so
// the model does not link MPI (parallel/expert_parallel.cpp implements it over a Group).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace cleave {

class EpComm {
 public:
  using Wait = std::function<void()>;
  virtual ~EpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[r * n ...] = rank r's send[rank * n ...].
  virtual Wait all_to_all(const float* send, float* recv, int64_t n) = 0;
  // send_counts[r] floats of send (in rank order) go to rank r; recv_counts[r] come from it.
  virtual Wait all_to_allv(const float* send, const std::vector<int64_t>& send_counts,
                           float* recv, const std::vector<int64_t>& recv_counts) = 0;
};

}  // namespace cleave
