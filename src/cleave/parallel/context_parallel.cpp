#include "cleave/parallel/context_parallel.h"

namespace cleave {

CpComm::Wait GroupCpComm::all_gather(const float* send, float* recv, int64_t n) {
  sent(ring_gather_bytes(n * 4, size()));
  return waiter(group_.all_gather(send, recv, n, CommType::f32, CommAlgo::ours));
}

CpComm::Wait GroupCpComm::reduce_scatter(const float* send, float* recv, int64_t n) {
  sent(ring_gather_bytes(n * 4, size()));
  return waiter(group_.reduce_scatter(send, recv, n, CommType::f32, CommAlgo::ours));
}

CpComm::Wait GroupCpComm::all_to_all(const float* send, float* recv, int64_t n) {
  sent(n * 4 * (size() - 1));
  return waiter(group_.all_to_all(send, recv, n, CommType::f32));
}

CpComm::Wait GroupCpComm::ring_shift(const float* send, float* recv, int64_t n) {
  sent(n * 4);
  const int tag = next_tag_, p = size();
  next_tag_ = (next_tag_ + 1) % 32768;
  return waiter(group_.send(send, n, CommType::f32, (rank() + 1) % p, tag),
                group_.recv(recv, n, CommType::f32, (rank() + p - 1) % p, tag));
}

}  // namespace cleave
