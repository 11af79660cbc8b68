// Megatron's conjugate pairs of collectives, each a forward and its backward: the only
// communication between the regions of a tensor-parallel block (docs/tensor_parallel.md).
#pragma once
#include <cstdint>

#include "cleave/model/tp_comm.h"

namespace cleave {

// Megatron's conjugate pairs between the regions of a block (Korthikanti et al. 2022, fig. 5):
// rows are tokens, n the floats of one rank's rows. Each forward's backward is its conjugate.
namespace tp_pairs {
// identity / all-reduce: a replicated input enters a column-parallel linear ("f").
inline void copy_forward() {}
inline TpComm::Wait copy_backward(TpComm& c, float* dx, int64_t n) { return c.all_reduce(dx, n); }
// all-reduce / identity: a row-parallel linear's partial sums leave it ("g").
inline TpComm::Wait reduce_forward(TpComm& c, float* y, int64_t n) { return c.all_reduce(y, n); }
inline void reduce_backward() {}
// all-gather / reduce-scatter: the sequence-parallel rows enter a column-parallel linear.
inline TpComm::Wait gather_forward(TpComm& c, const float* x_local, float* x_full, int64_t n) {
  return c.all_gather(x_local, x_full, n);
}
inline TpComm::Wait gather_backward(TpComm& c, const float* dx_full, float* dx_local, int64_t n) {
  return c.reduce_scatter(dx_full, dx_local, n);
}
// reduce-scatter / all-gather: a row-parallel linear's partial sums leave as sequence shards.
inline TpComm::Wait scatter_forward(TpComm& c, const float* y_full, float* y_local, int64_t n) {
  return c.reduce_scatter(y_full, y_local, n);
}
inline TpComm::Wait scatter_backward(TpComm& c, const float* dy_local, float* dy_full, int64_t n) {
  return c.all_gather(dy_local, dy_full, n);
}
}  // namespace tp_pairs

}  // namespace cleave
