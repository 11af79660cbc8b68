#include "cleave/parallel/tensor_parallel.h"

#include <cstring>

#include "cleave/optim/grad_norm.h"

namespace cleave {

TpComm::Wait GroupTpComm::all_reduce(float* buf, int64_t n) {
  sent(ring_all_reduce_bytes(n * 4, size()));
  return waiter(group_.all_reduce(buf, n, CommType::f32, CommAlgo::ours));
}

TpComm::Wait GroupTpComm::all_gather(const float* send, float* recv, int64_t n) {
  sent(ring_gather_bytes(n * 4, size()));
  return waiter(group_.all_gather(send, recv, n, CommType::f32, CommAlgo::ours));
}

TpComm::Wait GroupTpComm::reduce_scatter(const float* send, float* recv, int64_t n) {
  sent(ring_gather_bytes(n * 4, size()));
  return waiter(group_.reduce_scatter(send, recv, n, CommType::f32, CommAlgo::ours));
}

void GroupTpComm::check_replicated(const float* buf, int64_t n, const std::string& what) {
  // A 64-bit FNV-1a hash of the bytes, carried as two floats' bit patterns (all-gather moves
  // bits, it does no arithmetic).
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(buf);
  for (int64_t i = 0; i < n * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
  float mine[2];
  std::memcpy(mine, &h, sizeof h);
  std::vector<float> all(2 * size_t(size()));
  waited(group_.all_gather(mine, all.data(), 2, CommType::f32, CommAlgo::ours).wait());
  for (int r = 1; r < size(); ++r)
    if (std::memcmp(all.data(), all.data() + 2 * r, 2 * sizeof(float)) != 0)
      throw Error("placement check: " + what + ": tp rank " + std::to_string(r) +
                  " holds other values than tp rank 0, so it is not replicated");
}

TensorParallelGrads::TensorParallelGrads(ParamStore& store, GroupTpComm& tp, Group& tp_group,
                                         GroupTpComm* kv_replicas)
    : store_(store), tp_(tp), tp_group_(tp_group), kv_(kv_replicas) {}

void TensorParallelGrads::reduce_partial(int64_t begin, int64_t end) {
  std::vector<TpComm::Wait> pending;
  for (int i = 0; i < int(store_.tensors().size()); ++i) {
    const ParamTensor& t = store_.tensor(i);
    if (t.offset < begin || t.offset >= end) continue;
    const Placement& p = t.placement;
    if (p.shard_dim < 0 && p.pending == kTpAxis)
      pending.push_back(tp_.all_reduce(store_.grad(i), t.numel));
    for (const Segment& s : p.segments) {
      if (s.pending != kKvReplicasAxis) continue;
      CLEAVE_CHECK(kv_ && p.shard_dim == 0, t.name << ": replicated kv rows without a kv group");
      const int64_t cols = t.numel / t.shape[0];
      pending.push_back(kv_->all_reduce(store_.grad(i) + s.local * cols, s.length * cols));
    }
  }
  for (auto& wait : pending) wait();
}

double TensorParallelGrads::owned_sum_of_squares(const std::vector<FlatRange>& ranges,
                                                 RangeBuffer grads) const {
  return cleave::owned_sum_of_squares(store_, ranges, grads, copy());
}

double owned_sum_of_squares(const ParamStore& store, const std::vector<FlatRange>& ranges,
                            RangeBuffer grads, TpCopy copy) {
  double sum = 0;
  for (const TensorPiece& piece : tensor_pieces(store, ranges)) {
    const ParamTensor& t = store.tensor(piece.tensor);
    const float* g = piece.in(grads);
    for (const GlobalBox& b : global_boxes(t.placement, t.shape, piece.begin, piece.end)) {
      if (copy.owns(t.placement, b))
        sum += sum_of_squares(g + (b.local_begin - piece.begin), b.box_end - b.box_begin);
    }
  }
  return sum;
}

double TensorParallelGrads::sum_over_tp(double local, double* waited) {
  return sum_of_doubles(tp_group_, local, waited);
}

}  // namespace cleave
