// What the data-parallel layouts keep resident, measured with mincore on the flat buffers during a
// real training step: DDP keeps the whole gradient; ZeRO-2 and ZeRO-3 hold only the gradients of
// the few units whose reduce-scatter is in flight; ZeRO-3 holds only the parameters of the units
// in use (and the one prefetched), and the shards are 1/dp_shard of each unit.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "comm_test_util.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"
#include "cleave/parallel/step_executor.h"

namespace cleave {
namespace {

// Bytes of [data, data + n) that are in memory (whole pages overlapping the range).
int64_t resident_bytes(const float* data, int64_t n) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(data) / page * page;
  const uintptr_t hi = (uintptr_t(data + n) + page - 1) / page * page;
  std::vector<unsigned char> in((hi - lo) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()), 0);
  int64_t pages = 0;
  for (unsigned char c : in) pages += c & 1;
  return pages * int64_t(page);
}

ModelConfig eight_layer_model() {
  ModelConfig c;
  c.family = Family::gpt2;
  c.vocab_size = 256;
  c.d_model = 64;
  c.n_layers = 8;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.ffn_hidden = 256;
  c.max_seq_len = 32;
  return c;
}

struct Residency {
  int64_t max_grads = 0, max_values = 0;  // the most seen at any hook during the step
  int64_t grads_after = 0, values_after = 0;  // after the step's end
  int64_t largest_units = 0;  // bytes of the four largest units
  int64_t total = 0;          // bytes of the whole flat buffer
  int64_t shard = 0;          // floats this rank updates
};

Residency one_step(int zero_stage) {
  Group& world = *test::g_world;
  const ModelConfig cfg = eight_layer_model();
  const uint64_t seed = 7;
  Transformer model(cfg, Precision::fp32, seed, 16 * world.size(),
                    zero_stage < 3 ? ParamValues::seeded : ParamValues::unset);
  Group alone(MPI_COMM_SELF, "dp_replicate");
  DataParallel dp(model.params(), {&world, &world, &alone}, zero_stage, 0.25, model.params().unit_bounds(0),
                  seed);
  ParamStore& store = model.params();
  Residency r;
  r.total = store.total() * 4;
  std::vector<int64_t> units;
  for (size_t u = 0; u + 1 < model.params().unit_bounds(0).size(); ++u)
    units.push_back((model.params().unit_bounds(0)[u + 1] - model.params().unit_bounds(0)[u]) * 4);
  std::sort(units.rbegin(), units.rend());
  for (int i = 0; i < 4; ++i) r.largest_units += units[i];
  for (const FlatRange& range : dp.ranges()) r.shard += range.end - range.begin;

  const int64_t B = 2, T = 32;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens[i] = int32_t((i * 37 + world.rank() * 11) % cfg.vocab_size);
    targets[i] = int32_t((i * 53 + 5) % cfg.vocab_size);
  }
  // One step as the trainer runs it: the one-stage schedule lowered to a step program.
  const Schedule schedule = generate_schedule("1f1b", 1, 1, 1);
  const Program program = lower_schedule(schedule, check_schedule(schedule).stages, 0,
                                         unit_layout(model), {zero_stage == 3, true, 1, {}});
  Group pp(MPI_COMM_SELF, "pp");
  AdamW optim(store, OptimConfig{}, dp.ranges(), zero_stage == 0);
  StepEnd end({&store, {{&dp, &optim, &world}}, &world, nullptr, nullptr, zero_stage, 0});
  StepParts parts;
  parts.model = &model;
  parts.dp = {&dp};
  parts.pp = &pp;
  parts.end = &end;
  parts.after_instruction = [&] {
    r.max_grads = std::max(r.max_grads, resident_bytes(store.grads().data(), store.total()));
    r.max_values = std::max(r.max_values, resident_bytes(store.values().data(), store.total()));
  };
  StepRun run;
  run.B = B;
  run.T = T;
  run.grad_scale = 1.0f / float(B * T * world.size());  // the mean over every rank's tokens
  run.fill = [&](int, Batch& batch) {
    batch.whole_sequences(B, T);
    std::copy(tokens.begin(), tokens.end(), batch.tokens.begin());
    std::copy(targets.begin(), targets.end(), batch.targets.begin());
  };
  run.lr = 1e-3;
  run.loss_tokens = double(B * T * world.size());
  dp.zero_gradients();
  StepExecutor(parts).run(program, run);
  r.grads_after = resident_bytes(store.grads().data(), store.total());
  r.values_after = resident_bytes(store.values().data(), store.total());
  return r;
}

TEST(DataParallelMemory, DdpKeepsWholeGradientAndParameters) {
  const Residency r = one_step(0);
  EXPECT_GE(r.grads_after, r.total * 9 / 10);
  EXPECT_GE(r.values_after, r.total * 9 / 10);
  EXPECT_EQ(r.shard * 4, r.total);
}

TEST(DataParallelMemory, Zero2HoldsOnlyTheGradientsInFlight) {
  const Residency r = one_step(2);
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int n_units = eight_layer_model().n_layers + 2;
  EXPECT_LE(r.max_grads, r.largest_units + 2 * n_units * page) << "of " << r.total << " bytes";
  EXPECT_LE(r.grads_after, 2 * n_units * page);  // at most the pages units share at their edges
  EXPECT_GE(r.values_after, r.total * 9 / 10);
  EXPECT_EQ(r.shard * 4 * test::g_world->size(), r.total);
}

TEST(DataParallelMemory, Zero3HoldsOnlyTheUnitsInUse) {
  const Residency r = one_step(3);
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int n_units = eight_layer_model().n_layers + 2;
  EXPECT_LE(r.max_grads, r.largest_units + 2 * n_units * page) << "of " << r.total << " bytes";
  EXPECT_LE(r.max_values, r.largest_units + 2 * n_units * page) << "of " << r.total << " bytes";
  EXPECT_LE(r.grads_after, 2 * n_units * page);
  EXPECT_LE(r.values_after, 2 * n_units * page);
  EXPECT_EQ(r.shard * 4 * test::g_world->size(), r.total);
}

}  // namespace
}  // namespace cleave
