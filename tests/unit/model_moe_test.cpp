// The mixture of experts: each router against a plain reference, the z-loss, the capacity's drop
// order, the bias update, and the layer's and a whole MoE model's gradients (balancing terms
// included) against central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cleave/kernels/moe_router.h"
#include "cleave/model/moe.h"
#include "cleave/model/transformer.h"
#include "finite_differences.h"

namespace cleave {
namespace {

// The plain reference: in double, by sorting (experts by descending key, ties to the lower).
struct Routed {
  std::vector<int> choice;
  std::vector<double> gate, probs;
};
Routed reference_route(MoeRouter r, const std::vector<float>& logits, const std::vector<float>& bias,
                       int E, int k) {
  Routed out;
  std::vector<double> l(logits.begin(), logits.end()), p(static_cast<size_t>(E)), key(p);
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (int e = 0; e < E; ++e) z += std::exp(l[size_t(e)] - m);
  for (int e = 0; e < E; ++e) {
    const double s = 1 / (1 + std::exp(-l[size_t(e)]));
    if (r == MoeRouter::sigmoid_bias) {
      p[size_t(e)] = s;
      key[size_t(e)] = double(float(s)) + bias[size_t(e)];
    } else {
      p[size_t(e)] = std::exp(l[size_t(e)] - m) / z;
      key[size_t(e)] = l[size_t(e)];
    }
  }
  std::vector<int> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return key[size_t(a)] > key[size_t(b)]; });
  out.choice.assign(order.begin(), order.begin() + k);
  double chosen = 0;
  for (int c : out.choice)
    chosen += r == MoeRouter::topk_softmax ? std::exp(l[size_t(c)] - m) : p[size_t(c)];
  for (int c : out.choice) {
    if (r == MoeRouter::softmax_topk) out.gate.push_back(p[size_t(c)]);
    else if (r == MoeRouter::topk_softmax) out.gate.push_back(std::exp(l[size_t(c)] - m) / chosen);
    else out.gate.push_back(p[size_t(c)] / chosen);
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  out.probs = p;
  if (r == MoeRouter::sigmoid_bias)
    for (double& v : out.probs) v /= total;
  return out;
}

const MoeRouter kRouters[] = {MoeRouter::topk_softmax, MoeRouter::softmax_topk,
                              MoeRouter::sigmoid_bias};

TEST(MoeRouter, ForwardMatchesReference) {
  const int E = 6, k = 2, N = 40;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> logits(N * E), bias(E);
  for (float& v : logits) v = n(rng);
  for (float& v : bias) v = 0.1f * n(rng);
  logits[3 * E + 1] = logits[3 * E + 4] = 9.0f;  // a tie: the lower expert comes first
  for (MoeRouter r : kRouters) {
    std::vector<int32_t> choice(N * k);
    std::vector<float> gate(N * k), probs(N * E);
    kernels::route_forward(r, logits.data(), bias.data(), N, E, k, choice.data(), gate.data(),
                           probs.data());
    for (int i = 0; i < N; ++i) {
      const Routed want = reference_route(
          r, {logits.begin() + i * E, logits.begin() + (i + 1) * E}, bias, E, k);
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(choice[i * k + j], want.choice[size_t(j)]) << moe_router_name(r) << " token " << i;
        EXPECT_NEAR(gate[i * k + j], want.gate[size_t(j)], 1e-6) << moe_router_name(r);
      }
      for (int e = 0; e < E; ++e) EXPECT_NEAR(probs[i * E + e], want.probs[size_t(e)], 1e-6);
    }
    if (r != MoeRouter::sigmoid_bias) {
      EXPECT_EQ(choice[3 * k], 1);
      EXPECT_EQ(choice[3 * k + 1], 4);
    }
  }
}

TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const int E = 5, k = 2, N = 6;
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> logits(N * E), d_gate(N * k), d_probs(N * E);
  // Logits well apart, so a small step changes no choice.
  for (int i = 0; i < N; ++i)
    for (int e = 0; e < E; ++e) logits[i * E + e] = 0.7f * float((e * 3 + i) % E) + 0.05f * n(rng);
  for (float& v : d_gate) v = n(rng);
  for (float& v : d_probs) v = n(rng);
  for (MoeRouter r : kRouters) {
    auto objective = [&](const std::vector<float>& l) {
      std::vector<int32_t> choice(N * k);
      std::vector<float> gate(N * k), probs(N * E);
      kernels::route_forward(r, l.data(), nullptr, N, E, k, choice.data(), gate.data(),
                             probs.data());
      double s = 0;
      for (int i = 0; i < N * k; ++i) s += double(d_gate[size_t(i)]) * gate[size_t(i)];
      for (int i = 0; i < N * E; ++i) s += double(d_probs[size_t(i)]) * probs[size_t(i)];
      return s;
    };
    std::vector<int32_t> choice(N * k);
    std::vector<float> gate(N * k), probs(N * E), d_logits(N * E);
    kernels::route_forward(r, logits.data(), nullptr, N, E, k, choice.data(), gate.data(),
                           probs.data());
    kernels::route_backward(r, logits.data(), choice.data(), gate.data(), d_gate.data(),
                            d_probs.data(), N, E, k, d_logits.data());
    for (int i = 0; i < N * E; ++i) {
      std::vector<float> up = logits, down = logits;
      up[size_t(i)] += 1e-2f;
      down[size_t(i)] -= 1e-2f;
      const double fd = (objective(up) - objective(down)) / 2e-2;
      EXPECT_NEAR(d_logits[size_t(i)], fd, 2e-3 + 1e-2 * std::fabs(fd))
          << moe_router_name(r) << " logit " << i;
    }
  }
}

TEST(MoeRouter, ZLoss) {
  const int E = 4, N = 3;
  std::vector<float> logits = {0.1f, -2.0f, 3.0f, 0.5f, 1, 1, 1, 1, -1, 0, 2, -3};
  std::vector<float> d(N * E, 0.0f);
  const double z = kernels::router_z_loss(logits.data(), N, E, 0.5f, d.data());
  double want = 0;
  for (int i = 0; i < N; ++i) {
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(double(logits[size_t(i * E + e)]));
    want += std::log(s) * std::log(s);
    for (int e = 0; e < E; ++e)
      EXPECT_NEAR(d[size_t(i * E + e)],
                  0.5 * 2 * std::log(s) * std::exp(double(logits[size_t(i * E + e)])) / s, 1e-5);
  }
  EXPECT_NEAR(z, want, 1e-5);
}

ModelConfig tiny_moe(Family f, MoeRouter r) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 23;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.ffn_hidden = f == Family::gpt2 ? 32 : 24;
  c.max_seq_len = 16;
  c.init_std = 0.3f;
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_ffn_hidden = 8;
  c.moe_shared_experts = 1;
  c.moe_router = r;
  c.moe_aux_loss_coef = 0.05f;
  c.moe_z_loss_coef = 0.01f;
  c.moe_first_dense = 1;
  c.tie_embeddings = false;
  return c;
}

// One MoE layer on its own store, with random parameters.
struct TestMoe {
  explicit TestMoe(const ModelConfig& c)
      : moe(store, "moe", 0, c, tp_share(c, 1, 0), Precision::fp32, {}, {}) {
    store.allocate(1);
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 0.3f);
    for (int i = 0; i < int(store.tensors().size()); ++i)
      for (int64_t j = 0; j < store.tensor(i).numel; ++j) store.value(i)[j] = n(rng);
    moe.bind(store);
    store.wrote_all();
  }
  ParamStore store;
  Moe moe;
};

// Capacity: per sequence, first choices in position order, then second choices; an expert past
// its capacity drops the rest.
TEST(MoeCapacity, DropsInPriorityOrder) {
  ModelConfig c = tiny_moe(Family::llama, MoeRouter::topk_softmax);
  c.moe_capacity_factor = 0.5f;  // ceil(0.5 x 8 x 2 / 4) = 2 choices per expert and sequence
  TestMoe t(c);
  const int64_t B = 3, T = 8, N = B * T, d = c.d_model, k = 2;
  std::mt19937 rng(8);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(N * d), y(N * d);
  for (float& v : x) v = n(rng);
  Batch batch;
  batch.whole_sequences(B, T);
  Moe::Saved s;
  Moe::Scratch g;
  t.moe.reserve(g, N);
  t.moe.forward(s, g, y.data(), x.data(), batch, true, 1.0f, true);
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int> used(4, 0);
    for (int j = 0; j < k; ++j)
      for (int64_t i = b * T; i < (b + 1) * T; ++i) {
        const int e = s.choice[size_t(i * k + j)];
        const bool keep = used[size_t(e)] < 2;
        used[size_t(e)] += keep;
        dropped += !keep;
        EXPECT_EQ(s.row[size_t(i * k + j)] >= 0, keep) << "token " << i << " choice " << j;
      }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(t.moe.take_stats().dropped, double(dropped));
}

TEST(MoeBias, MovesTowardEvenLoadAndKeepsMeanZero) {
  ModelConfig c = tiny_moe(Family::llama, MoeRouter::sigmoid_bias);
  c.moe_bias_update_rate = 0.01f;
  TestMoe t(c);
  t.moe.update_bias({10, 2, 5, 3});  // mean 5: expert 0 over, 2 even, 1 and 3 under
  const std::vector<float>& b = t.moe.bias();
  EXPECT_LT(b[0], b[2]);
  EXPECT_GT(b[1], b[2]);
  EXPECT_FLOAT_EQ(b[1], b[3]);
  EXPECT_NEAR(b[0] + b[1] + b[2] + b[3], 0.0f, 1e-7);
  for (int step = 0; step < 50; ++step) t.moe.update_bias({1, 7, 4, 4});
  float sum = 0;
  for (float v : b) sum += v;
  EXPECT_NEAR(sum, 0.0f, 1e-6);
  EXPECT_GT(b[0], b[2]);
  EXPECT_GT(b[2], b[1]);
}

// The whole model's loss is the tokens' mean cross-entropy plus the balancing terms (the
// auxiliary loss's mean over sequences, the z-loss's over tokens); its gradient, checked. A
// finite difference across a change of choice is meaningless: with top_k < experts the model is
// chosen so that none of the steps changes one (GPT-2's); Llama's runs with every expert chosen.
void check_moe_transformer(Family f, MoeRouter r, int top_k) {
  ModelConfig c = tiny_moe(f, r);
  c.moe_top_k = top_k;
  Transformer model(c, Precision::fp32, 5);
  const int64_t B = 2, T = 6, N = B * T;
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i)
    tokens[i] = int32_t((i * 5 + 3) % c.vocab_size), targets[i] = int32_t((i * 11 + 1) % c.vocab_size);
  auto loss = [&] {
    model.forward(tokens.data(), targets.data(), B, T, 1.0f);  // counts the routing statistics
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += model.losses()[i];
    s /= double(N);
    for (const MoeLayerStats& st : model.take_moe_stats()) s += st.aux / double(B) + st.z / double(N);
    return s;
  };
  ParamStore& store = model.params();
  store.grads().zero();
  model.forward(tokens.data(), targets.data(), B, T, 1.0f / float(N));
  model.backward();
  const std::vector<MoeLayerStats> stats = model.take_moe_stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_GT(stats[0].aux, 0.0);
  EXPECT_GT(stats[0].z, 0.0);
  EXPECT_EQ(std::accumulate(stats[0].tokens.begin(), stats[0].tokens.end(), 0.0),
            double(N * top_k));
  for (int i = 0; i < int(store.tensors().size()); ++i)
    expect_fd(store.tensor(i).name, store.value(i), store.grad(i), store.tensor(i).numel, loss,
              [&] { store.wrote_all(); }, 3);
}

TEST(MoeGradients, Gpt2TopkSoftmax) {
  check_moe_transformer(Family::gpt2, MoeRouter::topk_softmax, 2);
}
TEST(MoeGradients, LlamaEveryExpert) {
  for (MoeRouter r : kRouters) check_moe_transformer(Family::llama, r, 4);
}

// The layer's gradients, through router, experts and shared expert, for each router and family.
void check_layer(Family f, MoeRouter r) {
  const ModelConfig c = tiny_moe(f, r);
  TestMoe t(c);
  const int64_t B = 2, T = 5, N = B * T, d = c.d_model;
  std::mt19937 rng(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(N * d), dy(N * d), y(N * d), dx(N * d);
  for (float& v : x) v = n(rng);
  for (float& v : dy) v = n(rng);
  Batch batch;
  batch.whole_sequences(B, T);
  Moe::Saved s;
  Moe::Scratch g;
  t.moe.reserve(g, N);
  auto loss = [&] {
    t.moe.forward(s, g, y.data(), x.data(), batch, true, 0.0f, false);
    t.moe.add_bias(y.data(), N);
    double v = 0;
    for (int64_t i = 0; i < N * d; ++i) v += double(dy[size_t(i)]) * y[size_t(i)];
    return v;
  };
  loss();
  t.store.grads().zero();
  t.moe.backward_input(s, g, dx.data(), dy.data(), false);
  t.moe.backward_weight(s, x.data());
  expect_fd("x", x.data(), dx.data(), N * d, loss, [] {}, 8);
  for (int i = 0; i < int(t.store.tensors().size()); ++i)
    expect_fd(t.store.tensor(i).name, t.store.value(i), t.store.grad(i), t.store.tensor(i).numel,
              loss, [&] { t.store.wrote_all(); }, 3);
}

TEST(MoeGradients, LayerGpt2) {
  for (MoeRouter r : kRouters) check_layer(Family::gpt2, r);
}
TEST(MoeGradients, LayerLlama) {
  for (MoeRouter r : kRouters) check_layer(Family::llama, r);
}

}  // namespace
}  // namespace cleave
