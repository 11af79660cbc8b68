// cleave plan --search: the layouts it considers are exactly those `cleave train` accepts (against
// a brute force over a superset of the space); its bounds never exceed what they bound, and the
// bounded search returns exactly the top of costing every layout (those that fit in the device's
// memory, by predicted tokens/s), or the smallest when none fits; the winner explained against
// the runner-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cleave/base/check.h"
#include "cleave/parallel/layout.h"
#include "cleave/plan/layout_bounds.h"
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

// Hosts of `per_host` devices, links between them 4 times slower; ranks that wait for each other
// stretched by `imbalance` (0: none).
Cluster flat_cluster(double memory_gib, int per_host = 8, double imbalance = 0) {
  Cluster c;
  c.name = "flat";
  c.devices_per_host = per_host;
  c.compute_imbalance = imbalance;
  c.memory_gib = memory_gib;
  c.memory_gbps = 10;
  c.peak_gflops[Precision::fp32] = 100;
  c.gemm[Precision::fp32] = GemmTable({{64, 64, 64, 50}}, "flat");
  LinkCosts intra, inter;
  for (Collective k : kCollectives) {
    intra[size_t(k)] = {{1.0, 10.0}};
    inter[size_t(k)] = {{4.0, 2.5}};
  }
  c.links[size_t(LinkClass::intra_host)] = intra;
  c.links[size_t(LinkClass::inter_host)] = inter;
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

// Every valid layout costed in full: those that fit first, by predicted tokens/s, then the rest by
// memory, ties in the order valid_layouts lists them.
std::vector<Ranked> brute_force(const ModelConfig& model, const StepOptions& step, int world,
                                const Cluster& cluster) {
  std::vector<Ranked> all;
  for (const Candidate& c : valid_layouts(model, {}, step, world))
    all.push_back(cost_layout(model, c, "none", world, cluster));
  std::stable_sort(all.begin(), all.end(), [](const Ranked& a, const Ranked& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.prediction.tokens_per_second > b.prediction.tokens_per_second;
    return a.peak_bytes < b.peak_bytes;
  });
  return all;
}

TEST(PlanSearch, BoundsNeverExceedWhatTheyBound) {
  struct Case {
    ModelConfig model;
    int world;
    const char* schedule;
  };
  for (const Case& k : {Case{tiny_model(), 4, "1f1b"}, Case{tiny_model(), 4, "interleaved"},
                        Case{tiny_model(), 4, "zbv"}, Case{tiny_model(), 2, "gpipe"},
                        Case{tiny_model(4), 2, "1f1b"}})
    for (auto [per_host, imbalance] : {std::pair{8, 0.0}, {1, 0.0}, {8, 1.3}}) {
      const ModelConfig& model = k.model;
      const int world = k.world;
      ParallelConfig base;
      base.pp_schedule = k.schedule;
      const Cluster cluster = flat_cluster(1e6, per_host, imbalance);
      LayoutBounds bounds(model, "none", world, cluster);
      double bound_sum = 0, step_sum = 0, bytes_sum = 0, planned_sum = 0;
      for (const Candidate& c : valid_layouts(model, base, tiny_step(), world)) {
        const Ranked r = cost_layout(model, c, "none", world, cluster);
        ASSERT_TRUE(r.fits);
        const PipelinePlan p = plan_pipeline(model, c.parallel, c.parallel.pp,
                                             c.step.grad_accum_steps);
        const double seconds = bounds.step_seconds(c.parallel, c.step, p);
        EXPECT_LE(seconds, r.prediction.step_seconds * (1 + 1e-9)) << c.label();
        const double bytes = bounds.memory_bytes(c.parallel, c.step, p);
        EXPECT_LE(bytes, double(r.peak_bytes)) << c.label();
        bound_sum += seconds;
        step_sum += r.prediction.step_seconds;
        bytes_sum += bytes;
        planned_sum += double(r.peak_bytes);
      }
      // Close enough to prune: most of a step is the micro-batches' own work, most of a rank's
      // memory its state and activations.
      const std::string where = std::string(k.schedule) + ", " + std::to_string(per_host) +
                                " per host, imbalance " + std::to_string(imbalance);
      EXPECT_GT(bound_sum, 0.5 * step_sum) << where;
      EXPECT_GT(bytes_sum, 0.3 * planned_sum) << where;
    }
}

TEST(PlanSearch, FindsExactlyTheTopOfCostingEveryLayout) {
  const ModelConfig model = tiny_model();
  const StepOptions step = tiny_step();
  const int world = 4;
  const std::vector<Ranked> roomy = brute_force(model, step, world, flat_cluster(16, 2));
  ASSERT_GT(roomy.size(), 100u);
  // Memory between the smallest and the largest layout's: some fit, some do not.
  int64_t lo = roomy[0].peak_bytes, hi = lo;
  for (const Ranked& r : roomy) lo = std::min(lo, r.peak_bytes), hi = std::max(hi, r.peak_bytes);
  for (double gib : {16.0, double(lo + hi) / 2 / double(1 << 30)}) {
    const Cluster cluster = flat_cluster(gib, 2);
    const std::vector<Ranked> all = gib == 16 ? roomy : brute_force(model, step, world, cluster);
    size_t fitting = 0;
    while (fitting < all.size() && all[fitting].fits) ++fitting;
    ASSERT_GT(fitting, 3u);
    if (gib < 16) {
      ASSERT_LT(fitting, all.size());
    }
    for (int top : {1, 3, 10}) {
      const SearchResult found = search_layouts(model, {}, step, "none", world, cluster, top);
      EXPECT_EQ(found.valid, all.size());
      EXPECT_EQ(found.valid, found.beyond_memory + found.beyond_time + found.planned);
      EXPECT_FALSE(found.smallest);
      ASSERT_EQ(found.best.size(), size_t(top));
      for (int i = 0; i < top; ++i) {
        EXPECT_EQ(found.best[size_t(i)].candidate.label(), all[size_t(i)].candidate.label()) << i;
        EXPECT_EQ(found.best[size_t(i)].prediction.tokens_per_second,
                  all[size_t(i)].prediction.tokens_per_second);
      }
      // The bounds spare most of the costing; where some do not fit, the memory bound shows it.
      EXPECT_LT(found.planned, all.size() / 2) << top << " best of " << gib << " GiB";
      if (gib < 16) {
        EXPECT_GT(found.beyond_memory, 0u) << top;
      }
    }
  }
  // Ranks that wait for the slowest: the bounds stretch as the costing does.
  const Cluster uneven = flat_cluster(16, 2, 1.3);
  const std::vector<Ranked> stretched = brute_force(model, step, world, uneven);
  const SearchResult found = search_layouts(model, {}, step, "none", world, uneven, 3);
  ASSERT_EQ(found.best.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(found.best[i].candidate.label(), stretched[i].candidate.label()) << i;
    EXPECT_EQ(found.best[i].prediction.tokens_per_second,
              stretched[i].prediction.tokens_per_second);
    EXPECT_LT(stretched[i].prediction.tokens_per_second, roomy[i].prediction.tokens_per_second);
  }

  // None fits: the one that needs the least memory.
  const Cluster tiny = flat_cluster(double(lo) / 2 / double(1 << 30), 2);
  const SearchResult none = search_layouts(model, {}, step, "none", world, tiny, 3);
  EXPECT_TRUE(none.best.empty());
  ASSERT_TRUE(none.smallest);
  EXPECT_EQ(none.smallest->peak_bytes, lo);

  const SearchResult two = search_layouts(model, {}, step, "none", world, flat_cluster(16, 2), 2);
  const std::string why = explain_winner(two.best[0], two.best[1]);
  EXPECT_NE(why.find(two.best[0].candidate.label()), std::string::npos) << why;
  EXPECT_NE(why.find(two.best[1].candidate.label()), std::string::npos) << why;
  // Equal throughputs tie, whatever their parts.
  Ranked twin = two.best[1];
  twin.prediction.tokens_per_second = two.best[0].prediction.tokens_per_second;
  const std::string tie = explain_winner(two.best[0], twin);
  EXPECT_NE(tie.find(" tie at "), std::string::npos) << tie;
  if (two.best[0].prediction.tokens_per_second != two.best[1].prediction.tokens_per_second) {
    EXPECT_EQ(why.find(" tie at "), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace cleave
