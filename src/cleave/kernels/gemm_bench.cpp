#include "cleave/kernels/gemm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "cleave/base/buffer.h"
#include "cleave/base/check.h"
#include "cleave/base/pseudo_random.h"
#include "cleave/kernels/bench_timing.h"
#include "cleave/kernels/weight_pack.h"

namespace cleave {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::vector<GemmBenchResult> bench_linear_shapes(
    const std::vector<std::tuple<int64_t, int, int>>& shapes, Precision precision,
    double seconds_per_shape) {
  std::vector<GemmBenchResult> results;
  for (const auto& [N, in, out] : shapes) {
    std::vector<float> w(size_t(out) * in), x(size_t(N) * in), y(size_t(N) * out),
        dy(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
    fill_pseudo_random(w, 1, 0.05f);
    fill_pseudo_random(x, 2, 2.f);
    fill_pseudo_random(dy, 3, 0.01f);
    LinearGemm gemm(in, out, precision);
    gemm.set_weight(w.data());
    const double flops = 2.0 * double(N) * in * out;
    const double budget = seconds_per_shape / 3;
    auto record = [&](const char* pass, const std::function<void()>& setup,
                      const std::function<void()>& fn) {
      GemmBenchResult r;
      r.N = N;
      r.in = in;
      r.out = out;
      r.pass = pass;
      r.precision = precision;
      const Timing t = time_calls(setup, fn, budget);
      r.seconds = t.median;
      r.repetitions = t.reps;
      r.gflops = flops / t.median * 1e-9;
      r.best_gflops = flops / t.best * 1e-9;
      results.push_back(r);
    };
    // As in a training step: forward and backward_input include converting x and dy to bf16 (in
    // bf16 mode), and backward_weight uses the copies they kept.
    OperandCopy x_copy, dy_copy;
    record("fwd", nullptr, [&] { gemm.forward(y.data(), x.data(), N, nullptr, &x_copy); });
    record("bwd_input", nullptr,
           [&] { gemm.backward_input(dx.data(), dy.data(), N, false, &dy_copy); });
    record("bwd_weight", nullptr, [&] {
      gemm.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N, &dy_copy, &x_copy);
    });
  }
  return results;
}

std::vector<PackBenchResult> bench_weight_packing(
    const std::vector<std::tuple<int64_t, int, int>>& shapes, Precision precision,
    double seconds_per_shape) {
  using dnnl::memory;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<PackBenchResult> results;
  for (const auto& [N, in, out] : shapes) {
    const auto preferred =
        kernels::preferred_weight_layouts(N, in, out, precision == Precision::bf16);
    const auto fwd = kernels::blocked_layout(preferred.forward);
    const auto bin = kernels::blocked_layout(preferred.backward_input);
    if (!fwd || !bin) continue;  // pack_weight would hand these to the reorder itself
    const size_t w_bytes = size_t(out) * in * 4;
    constexpr size_t kColdBytes = size_t(128) << 20;  // several times any last-level cache here
    const int copies = int(std::clamp<size_t>(kColdBytes / w_bytes + 1, 2, 64));
    struct Copy {
      Buffer<float> w;
      Buffer<char> fwd, bin;
    };
    std::vector<Copy> pool;
    for (int c = 0; c < copies; ++c) {
      Copy copy{Buffer<float>(int64_t(out) * in),
                Buffer<char>(int64_t(preferred.forward.get_size())),
                Buffer<char>(int64_t(preferred.backward_input.get_size()))};
      std::vector<float> w(size_t(out) * in);
      fill_pseudo_random(w, uint32_t(c + 1), 0.05f);
      std::copy(w.begin(), w.end(), copy.w.data());
      pool.push_back(std::move(copy));
    }
    int next = 0;
    auto ours = [&] {
      Copy& c = pool[size_t(next++ % copies)];
      const kernels::PackTarget targets[] = {{&*fwd, true, c.fwd.data(), false},
                                             {&*bin, false, c.bin.data(), true}};
      kernels::pack_weight(c.w.data(), out, in, targets);
    };
    auto reorders = [&] {
      Copy& c = pool[size_t(next++ % copies)];
      for (bool transposed : {true, false}) {
        memory src(kernels::user_weight_desc(out, in, transposed), engine, c.w.data());
        memory dst(transposed ? preferred.forward : preferred.backward_input, engine,
                   transposed ? c.fwd.data() : c.bin.data());
        dnnl::reorder(src, dst).execute(stream, src, dst);
        stream.wait();
      }
    };
    PackBenchResult r;
    r.in = in;
    r.out = out;
    r.precision = precision;
    r.cleave_seconds = time_calls(nullptr, ours, seconds_per_shape / 2).median;
    r.reorder_seconds = time_calls(nullptr, reorders, seconds_per_shape / 2).median;
    results.push_back(r);
  }
  return results;
}

double overall_gflops(const std::vector<GemmBenchResult>& results) {
  double flops = 0, seconds = 0;
  for (const auto& r : results) {
    flops += 2.0 * double(r.N) * r.in * r.out;
    seconds += r.seconds;
  }
  return seconds > 0 ? flops / seconds * 1e-9 : 0.0;
}

double step_product_seconds(const std::vector<GemmBenchResult>& results, int n_layers,
                            int microbatches) {
  CLEAVE_CHECK(results.size() == 15, results.size() << " results are not 5 shapes x 3 passes");
  double block = 0, head = 0;
  for (size_t i = 0; i < results.size(); ++i) (i < 12 ? block : head) += results[i].seconds;
  return microbatches * (n_layers * block + head);
}

std::vector<std::tuple<int64_t, int, int>> gpt2_small_linear_shapes(int64_t N, int vocab) {
  return {{N, 768, 2304}, {N, 768, 768}, {N, 768, 3072}, {N, 3072, 768}, {N, 768, vocab}};
}

GemmPeak measure_gemm_peak(Precision precision, double max_seconds) {
  // Shapes of the size where oneDNN runs fastest on a CPU: every pass of each is a candidate.
  const std::vector<std::tuple<int64_t, int, int>> shapes = {
      {1024, 768, 3072}, {1024, 3072, 768}, {1024, 1024, 1024}, {2048, 1024, 2048}};
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  GemmPeak peak;
  double previous = 0;
  while (true) {
    double round_best = 0;
    for (const auto& r : bench_linear_shapes(shapes, precision, 0.2))
      round_best = std::max(round_best, r.best_gflops);
    ++peak.rounds;
    peak.gflops = std::max(peak.gflops, round_best);
    const bool stable = peak.rounds >= 3 && round_best < previous * 1.01;
    previous = std::max(previous, round_best);
    if (stable || elapsed() > max_seconds) break;
  }
  peak.seconds = elapsed();
  return peak;
}

}  // namespace cleave
