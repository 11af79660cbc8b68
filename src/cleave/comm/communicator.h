// The process-wide communication engine (internal): one progress thread runs the queued operations
// in issue order; a watchdog thread enforces timeout_seconds; the flight recorder and the status
// board record every operation; a SIGTERM handler reports where every rank stood (or, with
// sigterm_is_a_request(), takes a first SIGTERM as a request to save and exit, or to drain).
#pragma once
#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/comm/flight_recorder.h"
#include "cleave/comm/internal.h"
#include "cleave/comm/status.h"

namespace cleave {

class Communicator {
 public:
  // `hosts`: the host name of every world rank (for the status report).
  Communicator(const CommOptions& options, const std::string& status_dir, int world_rank,
               int world_size, std::vector<std::string> hosts);
  ~Communicator();  // stop() if not done yet

  // Runs what is queued to completion, then joins the threads.
  void stop();

  static Communicator* instance();  // null outside init_comm .. shutdown_comm
  static Communicator& get();       // throws a clear error outside init_comm .. shutdown_comm

  // Records the operation (flight recorder) and queues it for the progress thread; a local one
  // (WorkState::local) issued while no other operation of the rank is in flight runs to completion
  // on the calling thread instead, so a 1-rank group's sum costs no hand-over to the progress
  // thread and back (a wake-up each way: 0.3-0.6 ms under load).
  Work submit(std::shared_ptr<WorkState> w);

  // Persistent scratch buffers, grown on demand and reused across calls (allocated and first
  // touched once, no page faults afterwards). Only collectives use them, from the progress thread,
  // one collective at a time.
  void* scratch(int index, size_t bytes);
  static constexpr int kScratchBuffers = 4;

  // What begin_comm_capture/end_comm_capture (group.h) record.
  void begin_capture();
  std::vector<CommRecord> end_capture();

  comm_detail::StatusBoard& status() { return status_; }
  comm_detail::FlightRecorder& recorder() { return recorder_; }
  const CommOptions& options() const { return options_; }
  int world_rank() const { return world_rank_; }
  // Threads blocked in Work::wait now: while there is one, the rank computes nothing and the
  // progress thread polls without sleeping.
  int waiting() const { return waiting_.load(std::memory_order_relaxed); }

  // SIGTERM: the job is being torn down (usually because another rank died, failed or timed out).
  // Reports where every rank stood, unless a rank failed with an error (then the job ends for that
  // error, which that rank reported). Then leaves the status folder. Async-signal-safe.
  void write_signal_report(int signo);
  // This rank ends the job for an error of its own, which it reported (MPI_Abort follows): its
  // status says so, and the other ranks' SIGTERM handlers stay quiet.
  void mark_failed();

 private:
  void progress_loop();
  void watchdog_loop();
  bool start(const std::shared_ptr<WorkState>& w);  // false: failed to start (already finished)
  void run_here(const std::shared_ptr<WorkState>& w);  // start, progress and finish on this thread
  void finish(WorkState& w, const std::string& error);
  [[noreturn]] void on_timeout(const WorkState& w, double elapsed);

  CommOptions options_;
  int world_rank_, world_size_;
  double t0_;
  comm_detail::StatusBoard status_;
  comm_detail::FlightRecorder recorder_;
  Buffer<char> scratch_[kScratchBuffers];

  std::mutex queue_m_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<WorkState>> queue_;  // issued, not yet seen by the progress thread
  bool stop_ = false;
  std::atomic<int64_t> in_flight_{0};  // issued and not finished

  std::mutex active_m_;  // guards active_ (the progress thread changes it, the watchdog reads it)
  std::vector<std::shared_ptr<WorkState>> active_;

  std::mutex capture_m_;
  bool capturing_ = false;
  std::vector<CommRecord> captured_;

  std::mutex watchdog_m_;
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;
  std::atomic<bool> reported_{false};  // a timeout report was printed (SIGTERM then stays short)

  std::thread progress_thread_, watchdog_thread_;
  bool stopped_ = false;
  std::atomic<int> waiting_{0};  // waiting()
  friend class Work;
};

}  // namespace cleave
