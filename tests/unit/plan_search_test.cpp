// cleave plan --search: the layouts it considers are exactly those `cleave train` accepts (against
// a brute force over a superset of the space), ranked by predicted tokens/s with those that do
// not fit in the device's memory last, and the winner explained against the runner-up.
#include <gtest/gtest.h>

#include <set>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/search.h"

namespace cleave {
namespace {

ModelConfig tiny_model(int experts = 0) {
  ModelConfig m;
  m.family = Family::gpt2;
  m.vocab_size = 256;
  m.d_model = 64;
  m.n_layers = 4;
  m.n_heads = 4;
  m.n_kv_heads = 4;
  m.ffn_hidden = 256;
  m.max_seq_len = 64;
  if (experts > 0) {
    m.moe_experts = experts;
    m.moe_top_k = 2;
    m.moe_ffn_hidden = 64;
  }
  return m;
}

StepOptions tiny_step() {
  StepOptions s;
  s.seq_len = 64;
  s.micro_batch_size = 8;  // a global batch of 8 sequences
  s.grad_accum_steps = 1;
  return s;
}

Cluster flat_cluster(double memory_gib) {
  Cluster c;
  c.name = "flat";
  c.devices_per_host = 8;
  c.memory_gib = memory_gib;
  c.memory_gbps = 10;
  c.peak_gflops[Precision::fp32] = 100;
  c.gemm[Precision::fp32] = GemmTable({{64, 64, 64, 50}}, "flat");
  LinkCosts intra;
  for (Collective k : kCollectives) intra[size_t(k)] = {{1.0, 10.0}};
  c.links[size_t(LinkClass::intra_host)] = intra;
  return c;
}

TEST(PlanSearch, ConsidersExactlyTheLayoutsTrainAccepts) {
  const ModelConfig model = tiny_model();
  const StepOptions base = tiny_step();
  const int world = 4;
  std::set<std::string> found;
  for (const Candidate& c : valid_layouts(model, {}, base, world)) {
    EXPECT_TRUE(found.insert(c.label()).second) << "twice: " << c.label();
    EXPECT_EQ(int64_t(c.step.micro_batch_size) * c.step.grad_accum_steps, 8) << c.label();
  }
  // Every degree from 1 to the world on every axis, every micro-batch count up to the batch.
  std::set<std::string> brute;
  for (int pp = 1; pp <= world; ++pp)
    for (int R = 1; R <= world; ++R)
      for (int S = 1; S <= world; ++S)
        for (int cp = 1; cp <= world; ++cp)
          for (int tp = 1; tp <= world; ++tp)
            for (int zero = 0; zero <= 3; ++zero)
              for (bool sp : {false, true})
                for (const char* ac : {"none", "selective", "full"})
                  for (int accum = 1; accum <= 8; ++accum) {
                    if (8 % accum || (zero > 0 && S * cp == 1)) continue;
                    Candidate c;
                    c.parallel.pp = pp, c.parallel.dp_replicate = R, c.parallel.dp_shard = S;
                    c.parallel.cp = cp, c.parallel.tp = tp, c.parallel.zero_stage = zero;
                    c.parallel.sequence_parallel = sp;
                    c.step = base;
                    c.step.activation_checkpointing = ac;
                    c.step.grad_accum_steps = accum;
                    c.step.micro_batch_size = 8 / accum;
                    try {
                      plan_layout(model, c.parallel, c.step, world);
                    } catch (const Error&) {
                      continue;
                    }
                    brute.insert(c.label());
                  }
  EXPECT_EQ(found, brute);
  EXPECT_GT(found.size(), 50u);
  // A MoE model adds expert parallelism over dp_shard x cp.
  bool ep2 = false;
  for (const Candidate& c : valid_layouts(tiny_model(4), {}, base, 2)) ep2 |= c.parallel.ep == 2;
  EXPECT_TRUE(ep2);
}

TEST(PlanSearch, RanksThoseThatFitByPredictedThroughput) {
  const ModelConfig model = tiny_model();
  const std::vector<Ranked> all =
      search_layouts(model, {}, tiny_step(), "none", 2, flat_cluster(16));
  ASSERT_GT(all.size(), 10u);
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    EXPECT_TRUE(all[i].fits);
    EXPECT_GE(all[i].prediction.tokens_per_second, all[i + 1].prediction.tokens_per_second);
  }
  // Memory between the smallest and the largest layout's: those above it go last.
  int64_t lo = all[0].peak_bytes, hi = lo;
  for (const Ranked& r : all) lo = std::min(lo, r.peak_bytes), hi = std::max(hi, r.peak_bytes);
  const double gib = double(lo + hi) / 2 / double(1 << 30);
  const std::vector<Ranked> some = search_layouts(model, {}, tiny_step(), "none", 2, flat_cluster(gib));
  ASSERT_EQ(some.size(), all.size());
  size_t fitting = 0;
  while (fitting < some.size() && some[fitting].fits) ++fitting;
  EXPECT_GT(fitting, 0u);
  EXPECT_LT(fitting, some.size());
  for (size_t i = 0; i < some.size(); ++i) {
    EXPECT_EQ(some[i].fits, i < fitting);
    EXPECT_EQ(some[i].fits, double(some[i].peak_bytes) <= gib * double(1 << 30));
  }
  const std::string why = explain_winner(all[0], all[1]);
  EXPECT_NE(why.find(all[0].candidate.label()), std::string::npos) << why;
  EXPECT_NE(why.find(all[1].candidate.label()), std::string::npos) << why;
}

}  // namespace
}  // namespace cleave
