// train.async_checkpoint: one checkpoint's files written on threads of their own while training
// goes on (docs/checkpoints.md, Async checkpoints). The trainer copies the state into memory and
// gathers the pieces' lists at the step's end; every MPI call stays on the training thread, since
// every rank must issue its collectives in one order, which a second issuing thread would break.
// These threads only write files: each rank's own, then, once the ranks agree that all are written
// (at a later step's end), rank 0's meta.json and the rename into place.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "cleave/checkpoint/safetensors.h"

namespace cleave {

class BackgroundSave {
 public:
  // file index -> checksums, of the files this rank wrote
  using Checksums = std::map<int, FileChecksums>;
  // Starts `write` (this rank's files) on a thread. finish: on rank 0, the folder's completion
  // from the checksums of the files it wrote (empty on the other ranks). stall_seconds: what the
  // save cost the training thread, for the report.
  BackgroundSave(int64_t step, double stall_seconds, std::function<Checksums()> write,
                 std::function<void(const Checksums&)> finish);
  // Waits for the threads; an error of theirs is then dropped (the run is failing already).
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  int64_t step() const { return step_; }
  double stall_seconds() const { return stall_seconds_; }
  // This rank's files are written (or failed to be: all_written rethrows).
  bool written() const { return written_.load(std::memory_order_acquire); }
  void wait_written();
  // Every rank's files are written: waits for this rank's writer (rethrowing its error) and
  // starts finish, if any, on a thread.
  void all_written();
  bool agreed() const { return agreed_; }
  // Nothing is left to run: all_written was called and finish, if any, has ended.
  bool done() const { return agreed_ && finished_.load(std::memory_order_acquire); }
  // Waits for finish (after all_written) and rethrows its error.
  void wait();
  // Seconds the threads spent writing and finishing, this rank's.
  double busy_seconds() const { return write_seconds_ + finish_seconds_; }

 private:
  int64_t step_;
  double stall_seconds_;
  std::function<void(const Checksums&)> finish_;
  Checksums checksums_;
  std::exception_ptr write_error_, finish_error_;
  double write_seconds_ = 0, finish_seconds_ = 0;
  std::atomic<bool> written_{false}, finished_{false};
  bool agreed_ = false;
  std::thread writer_, finisher_;
};

}  // namespace cleave
