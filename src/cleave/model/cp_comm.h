// Context parallelism as the model sees it (docs/context_parallel.md): each sequence is cut into
// 2 x cp chunks dealt zigzag, cp rank r holding chunks r and 2cp-1-r (so that every rank does
// the same causal work), and attention exchanges keys and values between the ranks. The groups
// are interfaces, so the model does not link MPI (parallel/context_parallel.cpp implements them).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace cleave {

// Collectives over a group of cp ranks on fp32 rows. Each starts the operation and returns what
// to call to wait for it; the rank's other work runs meanwhile.
struct ContextWork;  // context_attention.h

class CpComm {
 public:
  using Wait = std::function<void()>;
  virtual ~CpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv[r * n ...] = send of rank r.
  virtual Wait all_gather(const float* send, float* recv, int64_t n) = 0;
  // recv (n) = sum over ranks of their send[rank * n ...].
  virtual Wait reduce_scatter(const float* send, float* recv, int64_t n) = 0;
  // recv[r * n ...] = rank r's send[rank * n ...].
  virtual Wait all_to_all(const float* send, float* recv, int64_t n) = 0;
  // One step of a ring: send (n) goes to rank + 1, recv (n) comes from rank - 1 (mod size).
  virtual Wait ring_shift(const float* send, float* recv, int64_t n) = 0;
};

// ring: K/V travel around the cp group by send/recv, overlapped with the attention of the block
// in hand. allgather: K/V gathered per layer (again in backward, where their gradients are
// reduce-scattered). ulysses:
// all-to-all from a sequence shard of every head to the whole sequence of a share of the heads.
// hybrid: Ulysses over groups of cp_ulysses ranks inside a ring over cp / cp_ulysses groups.
enum class CpMode { ring, allgather, ulysses, hybrid };

CpMode parse_cp_mode(const std::string& name);  // throws Error naming the known modes
const char* cp_mode_name(CpMode m);

struct ContextParallelOptions {
  CpMode mode = CpMode::ring;
  int cp = 1, cp_rank = 0;
  // The ranks K/V travel (ring) or are gathered (allgather) over, and the Ulysses all-to-all
  // group: consecutive cp ranks (cp_ulysses of them; the whole cp group in ulysses mode). Null
  // when the mode has no such stage.
  CpComm* ring = nullptr;
  CpComm* ulysses = nullptr;
  // The whole cp group: a MoE layer gathers each sequence's routing counts over it.
  CpComm* group = nullptr;
  // The exchanges' work buffers, shared by every layer of a model (the Transformer makes them).
  std::shared_ptr<ContextWork> work;
  bool enabled() const { return cp > 1; }
};

// The zigzag deal: chunk `half` (0 or 1) of cp rank r.
inline int64_t zigzag_chunk(int cp, int r, int half) { return half == 0 ? r : 2 * cp - 1 - r; }

}  // namespace cleave
