// The flight recorder: a ring of this rank's last N operations (sequence number, op, group, bytes,
// algorithm, issue/start/end times), written at issue, start and completion. Reading it needs no
// lock, so the SIGTERM handler and the timeout watchdog can print it while operations run (an entry
// being rewritten at that moment may print half-updated; nothing else can go wrong).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "cleave/comm/internal.h"

namespace cleave::comm_detail {

struct FlightEntry {
  std::atomic<uint64_t> id{0};  // 0: unused
  uint64_t seq = 0;
  int32_t op = 0, algo = 0, p2p = 0, peer = -1, failed = 0;
  int64_t bytes = 0;
  double issued = 0, started = 0, ended = 0;  // wall seconds, 0: not yet
  char group[40] = {};
};

class FlightRecorder {
 public:
  FlightRecorder(int capacity, int world_rank, double t0);
  uint64_t add(const WorkState& w, double issued);  // returns the entry's id
  void started(uint64_t id, double t);
  void ended(uint64_t id, double t, bool failed);
  // Oldest to newest, times in seconds since init_comm. Async-signal-safe.
  void write(SafeText& out) const;
  std::string report() const;

 private:
  FlightEntry* find(uint64_t id);

  std::unique_ptr<FlightEntry[]> entries_;
  int capacity_;
  int world_rank_;
  double t0_;
  std::atomic<uint64_t> next_{1};
  std::mutex m_;  // serialises writers (the issuing thread and the progress thread)
};

}  // namespace cleave::comm_detail
