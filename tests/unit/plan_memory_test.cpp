// The planner's memory model (plan/memory.h): the ZeRO paper's model-state figures from its own
// recipe, Korthikanti et al.'s activations per layer from the blocks' own accounting, and a
// planned rank's state against the model's parameters under each ZeRO stage.
#include <gtest/gtest.h>

#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"
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

// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022),
// section 4: a GPT layer keeps s b h (34 + 5 a s / h) bytes of 2-byte activations without
// parallelism, s b h (10 + 24 / t + 5 a s / (h t)) under tensor parallelism of t,
// s b h (34 / t + 5 a s / (h t)) with sequence parallelism too, and 2 s b h with full
// recomputation. Per tensor, the 34 are: the layer's input, the two norms' outputs, Q, K, V, the
// attention's output, the MLP's 4h-wide input to GeLU and GeLU's output, the second norm's input
// (2 bytes each per element) and two dropout masks (1 byte each); the 5 a s / h is the attention
// matrix (softmax output, its dropout mask and output). Tensor parallelism splits all but the
// norms' inputs and outputs and the masks (10); sequence parallelism splits those too.
// cleave has no dropout and its flash attention keeps no attention matrix, only the softmax's
// log-sum-exp per head and row, and each norm keeps its mean and reciprocal deviation per row:
// so the planner's figure at 2 bytes per element, from what each block states it keeps
// (Block::saved_bytes) and its input, must be the paper's without the masks and the matrix, plus
// those few per-row values. The configurations are the paper's Table 3 (s = 2048, t = 8).
TEST(PlanMemory, KorthikantiActivationsPerLayer) {
  struct Paper {
    const char* name;
    int h, a;
  };
  const int64_t s = 2048, b = 1, t = 8;
  for (const Paper& p : {Paper{"22B", 6144, 64}, Paper{"175B", 12288, 96},
                         Paper{"530B", 20480, 128}, Paper{"1T", 25600, 160}}) {
    ModelConfig m;
    m.family = Family::gpt2;
    m.vocab_size = 1024;
    m.d_model = p.h;
    m.n_heads = m.n_kv_heads = p.a;
    m.ffn_hidden = 4 * p.h;
    m.n_layers = 1;
    m.max_seq_len = int(s);
    const double sbh = double(s * b * p.h);
    struct Case {
      int tp;
      bool sp;
      double paper_sbh;  // the paper's per-layer bytes over s b h, without the attention matrix
      double masks_sbh;  // of which the dropout masks
    };
    for (const Case& c : {Case{1, false, 34, 2}, Case{int(t), false, 10 + 24.0 / t, 2},
                          Case{int(t), true, 34.0 / t, 2.0 / t}}) {
      const std::unique_ptr<Transformer> model =
          Transformer::planned(m, c.tp, c.sp, {}, Precision::fp32, 1);
      int block = -1;
      for (int u = 0; u < model->n_units(); ++u)
        if (model->units()[size_t(u)].kind == Transformer::UnitKind::block) block = u;
      ASSERT_GE(block, 0);
      const double rows = double(c.sp ? s * b / c.tp : s * b);  // of the norms and the stream
      // fp32 throughout: elements = bytes / 4; the paper's recipe stores 2 bytes of each.
      const double input = rows * p.h * 4;
      const double planned = 2.0 * double(model->block_saved_bytes(block, b, s).whole() + input) / 4;
      const double per_row = double(s * b) * p.a / c.tp + rows * 4;  // log-sum-exp; norm stats
      const double expected = (c.paper_sbh - c.masks_sbh) * sbh + 2 * per_row;
      EXPECT_NEAR(planned, expected, 1e-9 * expected)
          << p.name << " tp " << c.tp << (c.sp ? " SP" : "") << ": planned "
          << planned / sbh << " s b h, the paper's less its masks "
          << (c.paper_sbh - c.masks_sbh) << " s b h";
    }
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

// ZeRO-3's peak walks the program: a unit's values from its gather or prefetch to its release,
// its weight copies from the product that makes each kind to that release. Three units (100, 200
// and 300 floats; copies 10 bytes rounded, 40 forward, 80 backward each), prefetching one ahead:
// the values peak at units 1 and 2 (500 floats), and unit 1's forward adds its rounding and
// forward copies (50 bytes) there. Holding every unit's, or two units' whole copies, would be 390
// or 260.
TEST(PlanMemory, Zero3PeakHoldsCopiesFromTheirProductToTheRelease) {
  Program program;
  auto add = [&](Op op, int unit) { program.instructions.push_back(Instruction{op, unit}); };
  add(Op::gather, 0), add(Op::prefetch, 1), add(Op::forward, 0), add(Op::release, 0);
  add(Op::gather, 1), add(Op::prefetch, 2), add(Op::forward, 1), add(Op::release, 1);
  add(Op::gather, 2), add(Op::forward, 2), add(Op::backward, 2), add(Op::release, 2);
  add(Op::gather, 1), add(Op::backward, 1), add(Op::release, 1);
  const std::vector<int64_t> floats = {100, 200, 300};
  const std::vector<LinearGemm::WeightCopies> copies(3, {10, 40, 80});
  const Zero3Peak with = zero3_peak(program, floats, copies);
  EXPECT_EQ(with.values, 500);
  EXPECT_EQ(with.copies, 50);
  const Zero3Peak without = zero3_peak(program, floats);
  EXPECT_EQ(without.values, 500);
  EXPECT_EQ(without.copies, 0);
  // Unit 2 alone, forward then backward: its values and all three copies at once.
  const Zero3Peak last = zero3_peak(program, {0, 0, 300}, copies);
  EXPECT_EQ(last.values, 300);
  EXPECT_EQ(last.copies, 130);
}

}  // namespace
}  // namespace cleave
