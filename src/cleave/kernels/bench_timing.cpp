#include "cleave/kernels/bench_timing.h"

#include <algorithm>
#include <chrono>

#include <pthread.h>
#include <time.h>

#include <omp.h>

#include "cleave/base/statistics.h"

namespace cleave {

namespace {

using Clock = std::chrono::steady_clock;

// The CPU clocks of the OpenMP team's threads, the pool oneDNN's products run on.
std::vector<clockid_t> team_clocks() {
  std::vector<clockid_t> clocks(size_t(omp_get_max_threads()), CLOCK_MONOTONIC);
#pragma omp parallel
  pthread_getcpuclockid(pthread_self(), &clocks[size_t(omp_get_thread_num())]);
  return clocks;
}

void read_clocks(const std::vector<clockid_t>& clocks, std::vector<double>& seconds) {
  for (size_t i = 0; i < clocks.size(); ++i) {
    timespec t{};
    clock_gettime(clocks[i], &t);
    seconds[i] = double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }
}

double wall_seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double elapsed_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

PairedTimes time_pairs(const std::function<void()>& a, const std::function<void()>& b,
                       double budget) {
  a(), b();
  PairedTimes t;
  const auto start = Clock::now();
  while (t.a.size() < 5 || elapsed_since(start) < budget) {
    t.b.push_back(wall_seconds(b));
    t.a.push_back(wall_seconds(a));
    if (t.a.size() >= 10000) break;
  }
  return t;
}

double median_extra_seconds(const std::function<void()>& a, const std::function<void()>& b,
                            double budget) {
  const PairedTimes t = time_pairs(a, b, budget);
  std::vector<double> extra(t.a.size());
  for (size_t i = 0; i < extra.size(); ++i) extra[i] = t.a[i] - t.b[i];
  return median(std::move(extra));
}

std::vector<double> time_each_call(const std::function<void()>& fn, double budget, int warmup) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 3 || elapsed_since(start) < budget) {
    times.push_back(wall_seconds(fn));
    if (times.size() >= 100000) break;
  }
  return times;
}

Timing time_calls(const std::function<void()>& setup, const std::function<void()>& fn,
                  double budget) {
  for (int i = 0; i < 2; ++i) {
    if (setup) setup();
    fn();
  }
  const std::vector<clockid_t> clocks = team_clocks();
  std::vector<double> cpu0(clocks.size()), cpu1(clocks.size());
  std::vector<double> times;
  double best = 1e30;
  const auto start = Clock::now();
  while (times.size() < 3 || elapsed_since(start) < budget) {
    if (setup) setup();
    read_clocks(clocks, cpu0);
    auto t0 = Clock::now();
    fn();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    read_clocks(clocks, cpu1);
    double busiest = 0;
    for (size_t i = 0; i < clocks.size(); ++i) busiest = std::max(busiest, cpu1[i] - cpu0[i]);
    times.push_back(wall);
    best = std::min(best, std::min(wall, busiest));
    if (times.size() >= 10000) break;
  }
  Timing t;
  t.reps = int(times.size());
  t.median = median(std::move(times));
  t.best = best;
  return t;
}

}  // namespace cleave
