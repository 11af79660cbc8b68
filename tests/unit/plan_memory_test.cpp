// The planner's memory model (plan/memory.h): the ZeRO paper's model-state figures from its own
// recipe, and a planned rank's state against the model's parameters under each ZeRO stage.
#include <gtest/gtest.h>

#include "cleave/parallel/layout.h"
#include "cleave/plan/memory.h"

namespace cleave {
namespace {

// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
// (2020), Figure 1: a 7.5B-parameter model on 64 devices with mixed-precision Adam holds 120,
// 31.4, 16.6 and 1.9 GB of model state per device under stages 0 to 3.
TEST(PlanMemory, ZeroPaperModelStates) {
  const double psi = 7.5e9, devices = 64;
  const double expected[] = {120, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const ModelState s = model_state(kZeroPaperRecipe, stage, psi, psi / devices, 0, 0);
    EXPECT_NEAR(s.total() / 1e9, expected[stage], 0.05) << "stage " << stage;
  }
}

ModelConfig tiny_gpt2() {
  ModelConfig m;
  m.family = Family::gpt2;
  m.vocab_size = 256;
  m.d_model = 64;
  m.n_layers = 8;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  m.ffn_hidden = 256;
  m.max_seq_len = 64;
  return m;
}

// Stage by stage on 4 ranks, 8 blocks (with few units, the two ZeRO-3 holds gathered are most of
// the model): ZeRO-1 shards the moments, ZeRO-2 the gradients too (with one
// micro-batch only the units awaiting their reduce-scatter stay whole), ZeRO-3 the values.
TEST(PlanMemory, ZeroStagesShardTheState) {
  const ModelConfig model = tiny_gpt2();
  StepOptions step;
  step.seq_len = 32;
  step.micro_batch_size = 8;
  MemoryPlan plans[4];
  for (int zero = 0; zero <= 3; ++zero) {
    ParallelConfig parallel;
    parallel.dp_shard = 4;
    parallel.zero_stage = zero;
    const Layout layout = plan_layout(model, parallel, step, 4);
    plans[zero] = plan_memory(model, parallel, step, "none", layout,
                              step_work(model, parallel, step, layout, 0), 0);
  }
  const int64_t all = plans[0].parameters / 4;
  EXPECT_GE(all, plans[0].parameter_count);
  EXPECT_EQ(plans[0].gradients, all * 4);
  EXPECT_EQ(plans[0].optimizer, all * 8);
  EXPECT_EQ(plans[1].optimizer, all * 8 / 4);
  EXPECT_EQ(plans[1].gradients, all * 4);
  EXPECT_LT(plans[2].gradients, all * 4);
  EXPECT_GT(plans[2].gradients, all * 4 / 4);
  EXPECT_EQ(plans[2].parameters, all * 4);
  EXPECT_LT(plans[3].parameters, all * 4);
  EXPECT_GT(plans[3].parameters, all * 4 / 4);
  for (const MemoryPlan& p : plans) EXPECT_GT(p.activations.total(), 0);
}

}  // namespace
}  // namespace cleave
