#include "cleave/kernels/gemm_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "cleave/base/buffer.h"
#include "cleave/kernels/weight_pack.h"

namespace cleave {

namespace {

using Clock = std::chrono::steady_clock;

void fill(std::vector<float>& v, uint32_t seed, float scale) {
  uint32_t s = seed * 2654435761u + 1;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = scale * (float(s >> 8) * (1.0f / 16777216.0f) - 0.5f);
  }
}

// Median seconds of `fn` after 2 warm-up calls, repeating for about `budget` seconds; `setup`
// (if any) runs untimed before each call.
double median_seconds(const std::function<void()>& setup, const std::function<void()>& fn,
                      double budget, int* reps_out) {
  for (int i = 0; i < 2; ++i) {
    if (setup) setup();
    fn();
  }
  std::vector<double> times;
  auto start = Clock::now();
  while (times.size() < 3 ||
         std::chrono::duration<double>(Clock::now() - start).count() < budget) {
    if (setup) setup();
    auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (times.size() >= 10000) break;
  }
  std::sort(times.begin(), times.end());
  *reps_out = int(times.size());
  size_t n = times.size();
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace

std::vector<GemmBenchResult> bench_linear_shapes(
    const std::vector<std::tuple<int64_t, int, int>>& shapes, Precision precision,
    double seconds_per_shape) {
  std::vector<GemmBenchResult> results;
  for (const auto& [N, in, out] : shapes) {
    std::vector<float> w(size_t(out) * in), x(size_t(N) * in), y(size_t(N) * out),
        dy(size_t(N) * out), dx(size_t(N) * in), dw(size_t(out) * in, 0.f);
    fill(w, 1, 0.05f);
    fill(x, 2, 2.f);
    fill(dy, 3, 0.01f);
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
      r.seconds = median_seconds(setup, fn, budget, &r.repetitions);
      r.gflops = flops / r.seconds * 1e-9;
      results.push_back(r);
    };
    // As in a training step: forward and backward_input include converting x and dy to bf16 (in
    // bf16 mode); backward_weight follows a forward and a backward_input (untimed) on the same
    // arrays, so it reuses their bf16 copies.
    record("fwd", nullptr, [&] { gemm.forward(y.data(), x.data(), N, nullptr); });
    record("bwd_input", nullptr, [&] { gemm.backward_input(dx.data(), dy.data(), N, false); });
    gemm.forward(y.data(), x.data(), N, nullptr);
    std::function<void()> before_bwd_weight;
    if (precision == Precision::bf16)
      before_bwd_weight = [&] { gemm.backward_input(dx.data(), dy.data(), N, false); };
    record("bwd_weight", before_bwd_weight,
           [&] { gemm.backward_weight(dw.data(), nullptr, dy.data(), x.data(), N); });
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
      fill(w, uint32_t(c + 1), 0.05f);
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
    int reps = 0;
    r.cleave_seconds = median_seconds(nullptr, ours, seconds_per_shape / 2, &reps);
    r.reorder_seconds = median_seconds(nullptr, reorders, seconds_per_shape / 2, &reps);
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

std::vector<std::tuple<int64_t, int, int>> gpt2_small_linear_shapes(int64_t N, int vocab) {
  return {{N, 768, 2304}, {N, 768, 768}, {N, 768, 3072}, {N, 3072, 768}, {N, 768, vocab}};
}

}  // namespace cleave
