// handle_signals_on_own_thread (base/signal_thread.h): after it, the calling thread, a thread it
// makes and OpenMP's workers block every routed signal, and a handler for one runs on the thread
// named cleave-signals, on that thread's own stack; a second call starts no second thread.
#include "cleave/base/signal_thread.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace cleave {
namespace {

std::atomic<pid_t> handler_tid{0};
std::atomic<uintptr_t> handler_sp{0};
extern "C" void on_usr1(int) {
  char probe;
  handler_sp = reinterpret_cast<uintptr_t>(&probe);
  handler_tid = pid_t(syscall(SYS_gettid));
}

pid_t own_tid() { return pid_t(syscall(SYS_gettid)); }

// Whether the calling thread blocks every routed signal.
bool blocks_routed() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  const sigset_t routed = routed_signals();
  for (int s = 1; s < NSIG; ++s)
    if (sigismember(&routed, s) == 1 && sigismember(&now, s) != 1) return false;
  return true;
}

std::string thread_name(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

int threads_named(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    n += thread_name(pid_t(std::stoi(e.path().filename().string()))) == name;
  return n;
}

TEST(SignalThread, RoutedSignalsRunTheirHandlersOnTheSignalThreadAlone) {
  const sigset_t routed = routed_signals();
  for (const int s : {SIGTERM, SIGINT}) EXPECT_EQ(sigismember(&routed, s), 1) << s;
  handle_signals_on_own_thread();
  handle_signals_on_own_thread();
  EXPECT_TRUE(blocks_routed()) << "the calling thread";
  bool made = false;
  std::thread([&] { made = blocks_routed(); }).join();
  EXPECT_TRUE(made) << "a thread made after the call";
  std::mutex m;
  std::set<pid_t> compute{own_tid()};
  int workers_blocking = 0, workers = 0;
#pragma omp parallel num_threads(2)
  {
    const bool b = blocks_routed();
    std::lock_guard<std::mutex> lock(m);
    compute.insert(own_tid());
    workers_blocking += b;
    workers = omp_get_num_threads();
  }
  EXPECT_EQ(workers_blocking, workers) << "OpenMP's workers";

  struct sigaction sa = {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, nullptr), 0);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (handler_tid == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t tid = handler_tid;
  ASSERT_NE(tid, 0) << "the handler never ran";
  EXPECT_EQ(compute.count(tid), 0u) << "the handler ran on a computing thread";
  EXPECT_EQ(thread_name(tid), "cleave-signals");
  EXPECT_EQ(threads_named("cleave-signals"), 1);
  // On the signal thread's stack: the mapping that holds the handler's frame is a thread's stack,
  // the one [stack] or an anonymous mapping whose pages include the probe, not the heap.
  std::ifstream maps("/proc/self/maps");
  std::string line, holder;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && handler_sp >= lo && handler_sp < hi)
      holder = line;
  }
  EXPECT_FALSE(holder.empty());
  EXPECT_EQ(holder.find("[heap]"), std::string::npos) << holder;
  signal(SIGUSR1, SIG_DFL);
}

}  // namespace
}  // namespace cleave
