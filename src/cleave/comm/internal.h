// Internals of the comm concern shared by its .cpp files (not part of the public contract, which
// is group.h): the operation kinds, the Task state machine the progress thread drives, the state
// behind a Work, bf16 helpers and a formatter that is safe inside a signal handler.
#pragma once
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "cleave/base/bf16.h"
#include "cleave/comm/group.h"

namespace cleave::comm_detail {

enum class Op : int32_t {
  create, destroy, all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, all_to_allv,
  gatherv, send, recv, barrier
};
constexpr int kOpCount = 12;

// How an operation is scheduled by the progress thread. Collectives start in issue order, each
// once the previous collective finished (they share the persistent buffers and must run in the
// same order on every rank). Point-to-point operations start at once, in issue order among
// themselves, also past collectives still waiting to start: matching sends and receives issued
// in either order on two ranks cannot deadlock, and a pipeline stage's transfer never waits for a
// data-parallel bucket (a collective's traffic is in a context of its own, so nothing can match
// across). A fence (creating or freeing a group) waits until everything before it finished, and
// holds back everything after it.
enum class Kind { p2p, collective, fence };

inline const char* op_name(Op op) {  // async-signal-safe
  static const char* const names[kOpCount] = {"create", "destroy", "all_reduce", "all_gather",
                                              "reduce_scatter", "broadcast", "all_to_all",
                                              "all_to_allv", "gatherv", "send", "recv",
                                              "barrier"};
  const int i = int(op);
  return i >= 0 && i < kOpCount ? names[i] : "?";
}

inline Kind op_kind(Op op) {
  switch (op) {
    case Op::send:
    case Op::recv: return Kind::p2p;
    case Op::create:
    case Op::destroy: return Kind::fence;
    default: return Kind::collective;
  }
}

inline const char* algo_name(CommAlgo a) {
  return a == CommAlgo::ours ? "ours" : a == CommAlgo::mpi ? "mpi" : "fastest";
}

inline size_t type_size(CommType t) {
  switch (t) {
    case CommType::f32: return 4;
    case CommType::bf16: return 2;
    case CommType::i64: return 8;
  }
  return 0;
}
inline MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::f32: return MPI_FLOAT;
    case CommType::bf16: return MPI_UINT16_T;
    case CommType::i64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// Seconds since the epoch (comparable between processes on one host: status files, reports).
inline double wall_seconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// MPI return code -> cleave::Error naming the call.
void check_mpi(int rc, const char* what);

// A running operation, advanced only by the progress thread. start() posts the first messages;
// progress() advances without blocking and returns true once the operation is complete; it sets
// `did_work` when something happened (the progress thread backs off while nothing does).
class Task {
 public:
  virtual ~Task() = default;
  virtual void start() = 0;
  virtual bool progress(bool& did_work) = 0;
};

// Appends text to a fixed buffer and hands full buffers to a sink: with the fd sink it is
// async-signal-safe (no allocation, no locks, write(2) only), so the SIGTERM report and the timeout
// report share the same formatting code.
class SafeText {
 public:
  using Sink = void (*)(void* ctx, const char* data, size_t n);
  SafeText(Sink sink, void* ctx) : sink_(sink), ctx_(ctx) {}
  ~SafeText() { flush(); }
  SafeText(const SafeText&) = delete;
  SafeText& operator=(const SafeText&) = delete;

  static void fd_sink(void* ctx, const char* data, size_t n);       // ctx: int* fd
  static void string_sink(void* ctx, const char* data, size_t n);   // ctx: std::string*

  SafeText& str(const char* s) {
    while (*s) chr(*s++);
    return *this;
  }
  SafeText& str(const char* s, size_t max) {  // at most max chars (for fixed char arrays)
    for (size_t i = 0; i < max && s[i]; ++i) chr(s[i]);
    return *this;
  }
  SafeText& chr(char c) {
    if (n_ == sizeof(buf_)) flush();
    buf_[n_++] = c;
    return *this;
  }
  SafeText& num(int64_t v);
  SafeText& unum(uint64_t v);
  SafeText& fixed(double v, int decimals);  // e.g. fixed(1.5, 3) -> "1.500"
  SafeText& bytes(int64_t b);               // human readable: "4 KiB", "1.5 MiB"
  void flush() {
    if (n_) sink_(ctx_, buf_, n_);
    n_ = 0;
  }

 private:
  Sink sink_;
  void* ctx_;
  char buf_[16384];  // large enough that most reports leave in one write(2)
  size_t n_ = 0;
};

}  // namespace cleave::comm_detail

namespace cleave {

// The state behind a Work: the operation's description (fixed at issue), its task, and its
// completion, signalled by the progress thread through the condition variable.
struct WorkState {
  comm_detail::Op op = comm_detail::Op::barrier;
  comm_detail::Kind kind = comm_detail::Kind::collective;
  std::string group;    // group name (flight recorder, reports)
  int slot = -1;        // the group's entry in the published status (-1: none)
  uint64_t seq = 0;     // collective: sequence number in the group; p2p: p2p count in the group
  int64_t bytes = 0;
  CommAlgo algo = CommAlgo::mpi;
  int peer = -1;        // send/recv peer, broadcast root
  // The operation involves no other rank and no MPI call (a 1-rank group's ring: a copy at most),
  // so the issuing thread may run it itself when nothing else is in flight (Communicator::submit).
  bool local = false;
  std::unique_ptr<comm_detail::Task> task;

  uint64_t record = 0;  // flight recorder id
  double started_wall = 0;
  std::chrono::steady_clock::time_point started;

  std::mutex m;
  std::condition_variable cv;
  std::atomic<bool> finished{false};
  std::string error;  // set before `finished` when the operation failed
};

}  // namespace cleave
