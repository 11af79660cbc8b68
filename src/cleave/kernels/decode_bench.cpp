#include "cleave/kernels/decode_bench.h"

#include <algorithm>

#include <omp.h>

#include "cleave/base/bf16.h"
#include "cleave/base/pseudo_random.h"
#include "cleave/base/statistics.h"
#include "cleave/kernels/attention.h"
#include "cleave/kernels/bench_timing.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/kernels/linear.h"

namespace cleave {

namespace {

constexpr int kLayers = 12, kHeads = 12, kHeadDim = 64, kModel = kHeads * kHeadDim;
constexpr int64_t kBlockRows = 64;

Spread spread_of(const std::vector<double>& seconds) {
  Spread s;
  s.p50 = quantile(seconds, 0.5);
  s.p90 = quantile(seconds, 0.9);
  s.p99 = quantile(seconds, 0.99);
  s.max = quantile(seconds, 1.0);
  s.runs = int(seconds.size());
  return s;
}

// A step's linears (gpt2_small_linear_shapes' block: qkv, attention output, MLP up and down, 12
// times), bf16, row tiles on; the layers share their fp32 sources, each packs its own copy, so a
// step reads 12 layers' weights.
struct StepLinears {
  std::vector<std::vector<float>> sources;
  std::vector<LinearGemm> linears;
  std::vector<int64_t> inputs, outputs;  // each linear's features: its operands' row strides
  std::vector<float> x, y;

  StepLinears() {
    auto shapes = gpt2_small_linear_shapes();
    shapes.pop_back();  // the LM head runs once a step, not once a layer
    for (size_t s = 0; s < shapes.size(); ++s) {
      const auto& [N, in, out] = shapes[s];
      sources.emplace_back(size_t(in) * size_t(out));
      fill_pseudo_random(sources.back(), uint32_t(s + 1), 0.04f);
    }
    for (int l = 0; l < kLayers; ++l)
      for (size_t s = 0; s < shapes.size(); ++s) {
        const auto& [N, in, out] = shapes[s];
        linears.emplace_back(in, out, Precision::bf16);
        linears.back().set_weight(sources[s].data());
        linears.back().set_row_invariant(true);
        inputs.push_back(in);
        outputs.push_back(out);
      }
  }
  void reserve(int64_t rows) {
    if (int64_t(x.size()) >= rows * 4 * kModel) return;
    x.resize(size_t(rows) * 4 * kModel);
    y.resize(x.size());
    fill_pseudo_random(x, 7, 2.0f);
  }
  // Rows [0, rows) in calls of `per_call` rows.
  void run(int64_t rows, int64_t per_call) {
    for (size_t i = 0; i < linears.size(); ++i)
      for (int64_t r = 0; r < rows; r += per_call)
        linears[i].forward(y.data() + r * outputs[i], x.data() + r * inputs[i],
                           std::min(per_call, rows - r), nullptr);
  }
};

}  // namespace

DecodeAttentionTiming time_decode_attention(double budget) {
  DecodeAttentionTiming t;
  t.sequences = 16;
  t.min_context = 100, t.max_context = 655;
  // Contexts spread evenly over the range, as a server's running requests are.
  std::vector<int64_t> past(size_t(t.sequences)), rows(size_t(t.sequences) + 1);
  std::vector<std::vector<int32_t>> tables(size_t(t.sequences));
  int32_t next_block = 0;
  double key_rows = 0;
  for (int s = 0; s < t.sequences; ++s) {
    past[size_t(s)] = t.min_context + (t.max_context - t.min_context) * s / (t.sequences - 1);
    rows[size_t(s) + 1] = s + 1;
    for (int64_t b = 0; b * kBlockRows < past[size_t(s)] + 1; ++b)
      tables[size_t(s)].push_back(next_block++);
    key_rows += double(past[size_t(s)] + 1);
  }
  std::vector<const int32_t*> table_ptrs;
  for (auto& b : tables) table_ptrs.push_back(b.data());
  const size_t cache = size_t(next_block) * kBlockRows * kModel;
  std::vector<float> k(cache), v(cache), q(size_t(t.sequences) * kModel);
  fill_pseudo_random(k, 11, 4.0f);
  fill_pseudo_random(v, 12, 4.0f);
  fill_pseudo_random(q, 13, 4.0f);
  std::vector<bf16> k16(cache), v16(cache);
  for (size_t i = 0; i < cache; ++i) k16[i] = to_bf16(k[i]), v16[i] = to_bf16(v[i]);
  std::vector<float> out(q.size()), lse(size_t(t.sequences) * kHeads);

  kernels::PagedAttention fp32;
  fp32.n_heads = fp32.n_kv_heads = kHeads;
  fp32.head_dim = kHeadDim;
  fp32.q_row_stride = fp32.kv_row_stride = kModel;
  fp32.block_rows = kBlockRows;
  fp32.sequences = t.sequences;
  fp32.rows = rows.data();
  fp32.past = past.data();
  fp32.blocks = table_ptrs.data();
  kernels::PagedAttention half = fp32;
  fp32.k = k.data(), fp32.v = v.data();
  half.k_bf16 = k16.data(), half.v_bf16 = v16.data();

  const PairedTimes times = time_pairs(
      [&] { kernels::attention_forward_paged(out.data(), lse.data(), q.data(), half); },
      [&] { kernels::attention_forward_paged(out.data(), lse.data(), q.data(), fp32); }, budget);
  t.bf16_seconds = median(times.a);
  t.fp32_seconds = median(times.b);
  t.calls = int(times.a.size());
  t.fp32_bytes = key_rows * 2 * kModel * sizeof(float);
  t.bf16_bytes = key_rows * 2 * kModel * sizeof(bf16);
  return t;
}

std::vector<RowTilesTiming> time_row_tiles(const std::vector<int64_t>& rows, double budget) {
  StepLinears step;
  std::vector<RowTilesTiming> result;
  for (int64_t n : rows) {
    step.reserve(n);
    const PairedTimes times = time_pairs([&] { step.run(n, n); },
                                         [&] { step.run(n, kInvariantRowTile); },
                                         budget);
    RowTilesTiming r;
    r.rows = n;
    r.one_call_seconds = median(times.a);
    r.tile_calls_seconds = median(times.b);
    r.pairs = int(times.a.size());
    result.push_back(r);
  }
  return result;
}

Spread step_products_spread(int64_t rows, double budget) {
  StepLinears step;
  step.reserve(rows);
  return spread_of(time_each_call([&] { step.run(rows, rows); }, budget, 5));
}

Spread fixed_arithmetic_spread(double seconds, double budget) {
  // A chain of multiply-adds per thread, too long for the compiler to fold and sized by timing.
  volatile double sink = 0;
  auto arithmetic = [&](int64_t iterations) {
    return [&sink, iterations] {
      double total = 0;
#pragma omp parallel reduction(+ : total)
      {
        double a = 1.0 + 1e-9 * omp_get_thread_num(), b = 0.999999;
        for (int64_t i = 0; i < iterations; ++i) a = a * b + 1e-7;
        total += a;
      }
      sink = sink + total;
    };
  };
  int64_t iterations = 1 << 16;
  for (;;) {
    const double took = median(time_each_call(arithmetic(iterations), 0.05, 1));
    if (took >= seconds / 2 || iterations > (int64_t(1) << 40)) {
      const double scale = seconds / std::max(took, 1e-9);
      iterations = std::max<int64_t>(1, int64_t(double(iterations) * scale));
      break;
    }
    iterations *= 4;
  }
  return spread_of(time_each_call(arithmetic(iterations), budget, 3));
}

}  // namespace cleave
