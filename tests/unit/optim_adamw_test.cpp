// AdamW, the learning-rate schedule and the gradient norm against straightforward references.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "cleave/optim/adamw.h"
#include "cleave/optim/grad_norm.h"
#include "cleave/optim/schedule.h"

namespace cleave {
namespace {

TEST(AdamW, MatchesReferenceWithDecayRule) {
  ParamStore store;
  store.add("w", {3, 5}, Init::normal, 0.5f);
  store.add("norm.weight", {7}, Init::ones);
  store.add("embed.wpe", {2, 4}, Init::normal, 0.5f);
  store.allocate(3);
  OptimConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.no_decay = {"wpe"};
  AdamW opt(store, cfg, {{0, store.total()}});
  EXPECT_TRUE(opt.decays(0));
  EXPECT_FALSE(opt.decays(1));
  EXPECT_FALSE(opt.decays(2));
  std::vector<double> p(store.total()), m(store.total()), v(store.total());
  for (int64_t i = 0; i < store.total(); ++i) p[i] = store.values()[i];
  for (int step = 1; step <= 3; ++step) {
    for (int64_t i = 0; i < store.total(); ++i) store.grads()[i] = std::sin(0.37 * i + step);
    const double lr = 1e-2 * step;
    const float scale = 0.5f;
    opt.step({store.values().data()}, {store.grads().data()}, lr, scale);
    for (int ti = 0; ti < 3; ++ti) {
      const ParamTensor& t = store.tensor(ti);
      for (int64_t j = 0; j < t.numel; ++j) {
        const int64_t i = t.offset + j;
        const double g = double(store.grads()[i]) * scale;
        m[i] = 0.9 * m[i] + 0.1 * g;
        v[i] = 0.95 * v[i] + 0.05 * g * g;
        const double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.95, step));
        if (opt.decays(ti)) p[i] *= 1 - lr * 0.1;
        p[i] -= lr * mh / (std::sqrt(vh) + 1e-8);
        EXPECT_NEAR(store.values()[i], p[i], 1e-5 * (1 + std::fabs(p[i]))) << t.name << j;
      }
    }
  }
}

TEST(AdamW, NoDecayPatternThatMatchesNothingIsAnError) {
  ParamStore store;
  store.add("embed.wte", {4, 3}, Init::normal, 0.5f);
  store.add("blocks.0.attn.qkv.weight", {3, 9}, Init::normal, 0.5f);
  store.allocate(3);
  OptimConfig cfg;
  auto error_of = [&](std::vector<std::string> patterns) {
    cfg.no_decay = std::move(patterns);
    try {
      AdamW opt(store, cfg, {{0, store.total()}});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of({"wte", "qkv"}), "");
  EXPECT_EQ(error_of({"wte", "c_attn"}),
            "optim.no_decay: \"c_attn\" matches no parameter of this model (first: embed.wte, "
            "last: blocks.0.attn.qkv.weight; docs/config.md lists them)");
  EXPECT_EQ(error_of({""}), "optim.no_decay: \"\" would match every parameter");
}

TEST(AdamW, ShardedRangesEqualTheWhole) {
  // Two optimizers over [0, cut) and [cut, total) update exactly as one over everything.
  auto make = [] {
    ParamStore s;
    s.add("a", {5, 7}, Init::normal, 0.5f);
    s.add("b", {9}, Init::normal, 0.5f);
    s.add("c", {3, 11}, Init::normal, 0.5f);
    s.allocate(1, 32);
    for (int64_t i = 0; i < s.total(); ++i) s.grads()[i] = std::cos(0.1 * i);
    return s;
  };
  ParamStore whole = make(), split = make(), in_place = make();
  OptimConfig cfg;
  AdamW all(whole, cfg, {{0, whole.total()}});
  // Pieces out of order, one cut inside tensor "a": each piece's values and gradients are
  // gathered into buffers that hold the ranges one after the other.
  const int64_t cut = 20, total = split.total();
  AdamW pieces(split, cfg, {{cut, total}, {0, cut}});
  AdamW pieces_in_place(in_place, cfg, {{cut, total}, {0, cut}});
  std::vector<float> values(total), grads(total);
  auto pack = [&](const float* flat, std::vector<float>& out) {
    std::copy(flat + cut, flat + total, out.begin());
    std::copy(flat, flat + cut, out.begin() + (total - cut));
  };
  pack(split.values().data(), values);
  pack(split.grads().data(), grads);
  for (int step = 0; step < 3; ++step) {
    all.step({whole.values().data()}, {whole.grads().data()}, 1e-2, 1.0f);
    pieces.step({values.data(), true}, {grads.data(), true}, 1e-2, 1.0f);
    // The values where they are in the flat buffer, the gradients packed (ZeRO-2).
    pieces_in_place.step({in_place.values().data()}, {grads.data(), true}, 1e-2, 1.0f);
  }
  std::copy(values.begin(), values.begin() + (total - cut), split.values().data() + cut);
  std::copy(values.begin() + (total - cut), values.end(), split.values().data());
  EXPECT_EQ(whole.total() % 32, 0);
  EXPECT_EQ(0, std::memcmp(whole.values().data(), split.values().data(), whole.total() * 4));
  EXPECT_EQ(0, std::memcmp(whole.values().data(), in_place.values().data(), whole.total() * 4));
}

TEST(Schedule, WarmupThenCosineAndLinear) {
  OptimConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(c, 0, 14), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(c, 3, 14), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(c, 4, 14), 1.0);
  EXPECT_NEAR(learning_rate(c, 13, 14), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(c, 8, 13), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  c.decay = LrDecay::linear;
  EXPECT_NEAR(learning_rate(c, 8, 13), 0.1 + 0.9 * 0.5, 1e-12);
  c.decay = LrDecay::constant;
  EXPECT_DOUBLE_EQ(learning_rate(c, 12, 13), 1.0);
}

TEST(GradNorm, FixedOrderSum) {
  std::vector<float> x(100003);
  double ref = 0;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.1 * i), ref += double(x[i]) * x[i];
  const double s = sum_of_squares(x.data(), int64_t(x.size()));
  EXPECT_NEAR(s, ref, 1e-6 * ref);
  EXPECT_EQ(s, sum_of_squares(x.data(), int64_t(x.size())));
}

}  // namespace
}  // namespace cleave
