#include "cleave/parallel/context_parallel.h"

#include <memory>

namespace cleave {

CpComm::Wait GroupCpComm::all_gather(const float* send, float* recv, int64_t n) {
  bytes_ += n * 4 * (size() - 1);
  auto work = std::make_shared<Work>(group_.all_gather(send, recv, n, CommType::f32, CommAlgo::ours));
  return [this, work] { exposed_ += work->wait(); };
}

CpComm::Wait GroupCpComm::reduce_scatter(const float* send, float* recv, int64_t n) {
  bytes_ += n * 4 * (size() - 1);
  auto work =
      std::make_shared<Work>(group_.reduce_scatter(send, recv, n, CommType::f32, CommAlgo::ours));
  return [this, work] { exposed_ += work->wait(); };
}

CpComm::Wait GroupCpComm::all_to_all(const float* send, float* recv, int64_t n) {
  bytes_ += n * 4 * (size() - 1);
  auto work = std::make_shared<Work>(group_.all_to_all(send, recv, n, CommType::f32));
  return [this, work] { exposed_ += work->wait(); };
}

CpComm::Wait GroupCpComm::ring_shift(const float* send, float* recv, int64_t n) {
  bytes_ += n * 4;
  const int tag = next_tag_, p = size();
  next_tag_ = (next_tag_ + 1) % 32768;
  auto out = std::make_shared<Work>(group_.send(send, n, CommType::f32, (rank() + 1) % p, tag));
  auto in = std::make_shared<Work>(group_.recv(recv, n, CommType::f32, (rank() + p - 1) % p, tag));
  return [this, out, in] { exposed_ += out->wait() + in->wait(); };
}

}  // namespace cleave
