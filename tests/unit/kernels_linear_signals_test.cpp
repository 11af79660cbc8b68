// fp32 products while another thread signals the process 20,000 times a second, after
// handle_signals_on_own_thread (base/signal_thread.h), as `cleave` runs them: every product's bits
// equal the first's and the heap stays whole through the malloc traffic between them. On a CPU
// without AVX-512 the products run oneDNN 2.6's GEMM kernels, which point the stack pointer at a
// heap buffer: there, without the call, a handler's frame lands in the heap and this test aborts
// in malloc or free within its first 50 products (as `cleave serve` did after a SIGTERM).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cleave/base/pseudo_random.h"
#include "cleave/base/signal_thread.h"
#include "cleave/kernels/linear.h"
#include "test_util.h"

namespace cleave {
namespace {

std::atomic<long> handled{0};
extern "C" void on_usr1(int) { handled.fetch_add(1); }

TEST(LinearSignals, ProductsKeepTheirBitsAndTheHeapWhileSignalsArrive) {
  handle_signals_on_own_thread();
  struct sigaction sa = {};
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(SIGUSR1, &sa, nullptr), 0);
  // GPT-2 124M's qkv product on a step of 128 rows.
  const int in = 768, out = 2304;
  const int64_t N = 128;
  std::vector<float> w(size_t(in) * out), x(size_t(N) * in);
  fill_pseudo_random(w, 1, 0.05f);
  fill_pseudo_random(x, 2, 1.0f);
  LinearGemm g(in, out, Precision::fp32);
  g.set_weight(w.data());
  std::vector<float> first(size_t(N) * out), y(first.size());
  g.forward(first.data(), x.data(), N, nullptr);
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    while (!stop) {
      kill(getpid(), SIGUSR1);
      usleep(50);
    }
  });
  int differing = 0;
  for (int i = 0; i < 200; ++i) {
    g.forward(y.data(), x.data(), N, nullptr);
    differing += !test_util::bitwise_equal(first, y);
    std::vector<char> churn(size_t(1000 + 16 * i), char(i));  // a server's malloc traffic
    differing += churn.back() != char(i);
  }
  stop = true;
  sender.join();
  signal(SIGUSR1, SIG_IGN);
  EXPECT_EQ(differing, 0);
  EXPECT_GT(handled.load(), 100) << "too few signals arrived to test anything";
}

}  // namespace
}  // namespace cleave
