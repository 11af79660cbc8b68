// How cleave's kernel benchmarks time a call and fill their inputs (kernels/gemm_bench.h,
// kernels/kernel_rates.h): the same warm-up, repetition and statistics for every measured rate.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace cleave {

struct Timing {
  double median = 0;  // wall seconds of one call
  // The shortest call, each taken as the CPU time of its busiest thread where that is less than
  // the wall time: neighbours that take a core away lengthen the wall time of a call, and the
  // time its other threads wait, but not the CPU time each thread needs for its share. So this
  // is the call's duration on an unshared machine (never shorter: a thread's own work is in it).
  double best = 0;
  int reps = 0;
};

// Times `fn` after 2 warm-up calls, repeating for about `budget` seconds (at least 3 calls);
// `setup` (if any) runs untimed before each call.
Timing time_calls(const std::function<void()>& setup, const std::function<void()>& fn,
                  double budget);

// The wall seconds of every call of `a` and of `b`, alternating (b, then a) for about `budget`
// seconds (at least 5 pairs, after one warm-up call each; at most 10,000). A pair runs in the
// same moment of a shared machine, so a slow spell lengthens both of it.
struct PairedTimes {
  std::vector<double> a, b;
};
PairedTimes time_pairs(const std::function<void()>& a, const std::function<void()>& b,
                       double budget);

// How much longer `a` takes than `b`: the median over time_pairs' pairs of a's seconds minus b's.
double median_extra_seconds(const std::function<void()>& a, const std::function<void()>& b,
                            double budget);

// The wall seconds of every call of `fn`, for about `budget` seconds (at least 3 calls, at most
// 100,000) after `warmup` untimed calls: a spread, where time_calls gives a rate.
std::vector<double> time_each_call(const std::function<void()>& fn, double budget, int warmup);

}  // namespace cleave
