#include "cleave/parallel/expert_parallel.h"

namespace cleave {

EpComm::Wait GroupEpComm::all_to_all(const float* send, float* recv, int64_t n) {
  sent(n * 4 * (size() - 1));
  return waiter(group_.all_to_all(send, recv, n, CommType::f32));
}

EpComm::Wait GroupEpComm::all_to_allv(const float* send, const std::vector<int64_t>& send_counts,
                                      float* recv, const std::vector<int64_t>& recv_counts) {
  for (int r = 0; r < size(); ++r)
    if (r != rank()) sent(send_counts[size_t(r)] * 4);
  return waiter(group_.all_to_allv(send, send_counts, recv, recv_counts, CommType::f32));
}

}  // namespace cleave
