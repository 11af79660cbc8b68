// What the step's communication cost a rank on each mesh axis: the seconds it waited on the axis's
// collectives (its exposed communication) and the bytes it sent into them (every collective
// counted as a ring, as plan/axis_volume.h predicts them). Each communicator keeps a CommMeter;
// the step's figures are one CommTraffic, a row per axis, so a new axis is a new row of
// kCommAxes and nothing else: the trainer's sums, the progress line and metrics.jsonl loop over
// the rows.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <utility>

#include "cleave/comm/group.h"

namespace cleave {

enum class CommAxis { dp, tp, pp, cp, ep };
inline constexpr std::array<CommAxis, 5> kCommAxes = {CommAxis::dp, CommAxis::tp, CommAxis::pp,
                                                      CommAxis::cp, CommAxis::ep};
inline const char* comm_axis_name(CommAxis a) {
  constexpr std::array<const char*, kCommAxes.size()> names = {"dp", "tp", "pp", "cp", "ep"};
  return names[size_t(a)];
}

struct AxisTraffic {
  double exposed_s = 0;  // waited on the axis's collectives
  int64_t bytes = 0;     // sent into them
};

class CommTraffic {
 public:
  AxisTraffic& operator[](CommAxis a) { return rows_[size_t(a)]; }
  const AxisTraffic& operator[](CommAxis a) const { return rows_[size_t(a)]; }
  CommTraffic& operator+=(const CommTraffic& o) {
    for (size_t i = 0; i < rows_.size(); ++i) {
      rows_[i].exposed_s += o.rows_[i].exposed_s;
      rows_[i].bytes += o.rows_[i].bytes;
    }
    return *this;
  }
  double exposed_seconds() const {
    double s = 0;
    for (const AxisTraffic& r : rows_) s += r.exposed_s;
    return s;
  }

 private:
  std::array<AxisTraffic, kCommAxes.size()> rows_{};
};

class CommMeter {
 public:
  double take_exposed_seconds() { return std::exchange(exposed_, 0.0); }
  int64_t take_bytes() { return std::exchange(bytes_, int64_t(0)); }
  // Both figures since the last take, added to the axis's row.
  void take_into(AxisTraffic& row) {
    row.exposed_s += take_exposed_seconds();
    row.bytes += take_bytes();
  }

 protected:
  void sent(int64_t bytes) { bytes_ += bytes; }
  // What to call to wait for the work, the wait counted as exposed.
  std::function<void()> waiter(Work work) {
    return [this, work]() mutable { exposed_ += work.wait(); };
  }
  std::function<void()> waiter(Work a, Work b) {
    return [this, a, b]() mutable { exposed_ += a.wait() + b.wait(); };
  }
  void waited(double seconds) { exposed_ += seconds; }

 private:
  double exposed_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace cleave
