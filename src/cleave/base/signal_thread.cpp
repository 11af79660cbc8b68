#include "cleave/base/signal_thread.h"

#include <pthread.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "cleave/base/check.h"

namespace cleave {

sigset_t routed_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (const int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD})
    sigaddset(&set, s);
  return set;
}

void handle_signals_on_own_thread() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = routed_signals();
    const int blocked = pthread_sigmask(SIG_BLOCK, &set, nullptr);
    CLEAVE_CHECK(blocked == 0, "blocking the routed signals: " << std::strerror(blocked));
    // Signals sent before it unblocks them stay pending for the process, and reach it then.
    std::thread([set] {
      pthread_setname_np(pthread_self(), "cleave-signals");
      pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
      for (;;) pause();
    }).detach();
  });
}

}  // namespace cleave
