// The tensor-parallel group as the model sees it: an interface, so the model does not link MPI
// (parallel/tensor_parallel.cpp implements it over a Group; docs/tensor_parallel.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace cleave {

// Collectives over the tp ranks on fp32 rows. Each starts the operation and returns what to call
// to wait for it; the rank's other work runs meanwhile.
class TpComm {
 public:
  using Wait = std::function<void()>;
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Wait all_reduce(float* buf, int64_t n) = 0;
  // recv[r * n ...] = send of rank r.
  virtual Wait all_gather(const float* send, float* recv, int64_t n) = 0;
  // recv (n) = sum over ranks of their send[rank * n ...].
  virtual Wait reduce_scatter(const float* send, float* recv, int64_t n) = 0;
  // Placement check mode (parallel.check_placements): fails naming `what` unless every tp rank
  // holds the same n floats at buf.
  virtual void check_replicated(const float* buf, int64_t n, const std::string& what) = 0;
};

struct TensorParallelOptions {
  TpComm* comm = nullptr;  // null: tp = 1
  bool sequence_parallel = false;
  bool check_placements = false;
  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
};

}  // namespace cleave
