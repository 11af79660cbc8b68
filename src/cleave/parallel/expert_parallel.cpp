#include "cleave/parallel/expert_parallel.h"

#include <memory>

namespace cleave {

EpComm::Wait GroupEpComm::all_to_all(const float* send, float* recv, int64_t n) {
  bytes_ += n * 4 * (size() - 1);
  auto work = std::make_shared<Work>(group_.all_to_all(send, recv, n, CommType::f32));
  return [this, work] { exposed_ += work->wait(); };
}

EpComm::Wait GroupEpComm::all_to_allv(const float* send, const std::vector<int64_t>& send_counts,
                                      float* recv, const std::vector<int64_t>& recv_counts) {
  for (int r = 0; r < size(); ++r)
    if (r != rank()) bytes_ += send_counts[size_t(r)] * 4;
  auto work = std::make_shared<Work>(
      group_.all_to_allv(send, send_counts, recv, recv_counts, CommType::f32));
  return [this, work] { exposed_ += work->wait(); };
}

}  // namespace cleave
