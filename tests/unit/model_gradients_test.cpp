// Backward of the model's modules against central finite differences at tiny sizes, for both
// families: Norm, Block (GPT-2 and Llama with GQA) and the whole Transformer (tied and untied
// heads). Each check perturbs inputs and a sample of every parameter tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "cleave/model/block.h"
#include "cleave/model/transformer.h"
#include "finite_differences.h"

namespace cleave {
namespace {

ModelConfig tiny(Family f, int n_kv_heads, bool tied) {
  ModelConfig c;
  c.family = f;
  c.vocab_size = 23;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = n_kv_heads;
  c.ffn_hidden = f == Family::gpt2 ? 64 : 24;
  c.max_seq_len = 16;
  c.tie_embeddings = tied;
  c.init_std = 0.3f;
  return c;
}

// Values far from the usual init, so every path carries signal (biases, norm weights).
void randomise(ParamStore& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (auto& t : s.tensors())
    for (int64_t i = 0; i < t.numel; ++i)
      s.value(&t - &s.tensors()[0])[i] = (t.init == Init::ones ? 1.0f : 0.0f) + n(rng);
}

// One block with random parameters, on its own store.
struct TestBlock {
  explicit TestBlock(const ModelConfig& c, Precision p = Precision::fp32)
      : rope(c.family == Family::llama ? std::optional<kernels::RopeTable>(std::in_place, c.head_dim(),
                                                                           c.max_seq_len, c.rope_theta)
                                       : std::nullopt),
        block(store, 0, c, p, rope ? &*rope : nullptr, spares) {
    store.allocate(1);
    randomise(store, 2);
    block.bind(store);
  }
  std::optional<kernels::RopeTable> rope;
  ParamStore store;
  RecomputeSpares spares;
  Block block;
};

void check_block(Family f, int n_kv_heads) {
  const ModelConfig c = tiny(f, n_kv_heads, true);
  TestBlock t(c);
  ParamStore& store = t.store;
  Block& block = t.block;
  const int64_t B = 2, T = 5, N = B * T, d = c.d_model;
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(N * d), dout(N * d), y(N * d), dx(N * d);
  for (auto& v : x) v = n(rng);
  for (auto& v : dout) v = n(rng);
  BlockGrads g;
  block.reserve_grads(g, N);
  Block::Saved saved;
  Batch batch;
  batch.whole_sequences(B, T);
  auto loss = [&] {
    block.forward(saved, y.data(), x.data(), batch, g);
    double s = 0;
    for (int64_t i = 0; i < N * d; ++i) s += double(dout[i]) * y[i];
    return s;
  };
  loss();
  store.grads().zero();
  block.backward(saved, dx.data(), dout.data(), g);
  auto none = [] {};
  expect_fd("x", x.data(), dx.data(), N * d, loss, none);
  for (int i = 0; i < int(store.tensors().size()); ++i)
    expect_fd(store.tensor(i).name.c_str(), store.value(i), store.grad(i), store.tensor(i).numel,
              loss, [&] { store.wrote_all(); });
}

// Two micro-batches in flight on two slots: the input halves, then the weight halves (as a
// zero-bubble schedule runs them) give the same bits as whole backwards in the same order. In
// bf16 a whole backward takes its own path through the MLP (the activation's backward writes fc's
// gradient straight to bf16 and, for GPT-2, sums fc's bias there); a deferred input half keeps
// fc's gradient in fp32 and its weight half sums the bias: a bias summed twice, or not at all,
// fails it.
void check_split_backward(Family f, Precision p = Precision::fp32) {
  const ModelConfig c = tiny(f, 2, true);
  TestBlock t(c, p);
  ParamStore& store = t.store;
  Block& block = t.block;
  Block::Saved s0, s1;
  const int64_t B = 2, T = 5, N = B * T, d = c.d_model;
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x0(N * d), x1(N * d), dout0(N * d), dout1(N * d), y(N * d);
  for (auto* v : {&x0, &x1, &dout0, &dout1})
    for (auto& e : *v) e = n(rng);
  BlockGrads g;
  block.reserve_grads(g, N);
  Batch batch;
  batch.whole_sequences(B, T);
  std::vector<float> dx0(N * d), dx1(N * d), fused0, fused1, fused_grads;
  block.forward(s0, y.data(), x0.data(), batch, g);
  block.forward(s1, y.data(), x1.data(), batch, g);
  store.grads().zero();
  block.backward(s1, dx1.data(), dout1.data(), g);
  block.backward(s0, dx0.data(), dout0.data(), g);
  fused0 = dx0, fused1 = dx1;
  fused_grads.assign(store.grads().data(), store.grads().data() + store.total());
  block.forward(s0, y.data(), x0.data(), batch, g);
  block.forward(s1, y.data(), x1.data(), batch, g);
  store.grads().zero();
  block.backward(s1, dx1.data(), dout1.data(), g, BackwardPart::input);
  block.backward(s0, dx0.data(), dout0.data(), g, BackwardPart::input);
  block.backward(s1, nullptr, nullptr, g, BackwardPart::weight);
  block.backward(s0, nullptr, nullptr, g, BackwardPart::weight);
  EXPECT_EQ(fused0, dx0);
  EXPECT_EQ(fused1, dx1);
  EXPECT_EQ(0, std::memcmp(fused_grads.data(), store.grads().data(), fused_grads.size() * 4));
}

// Activation checkpointing's building block: a block's saved activations freed after its forward
// and recomputed before its backward (all of them, or with selective recompute the cheap ones)
// give the same losses, input gradients and parameter gradients, bit for bit, as keeping them;
// here on two micro-batches in flight, in fp32 and bf16.
void check_recompute(Family f, Precision p, bool selective) {
  const ModelConfig c = tiny(f, 2, false);
  const int64_t B = 2, T = 6, N = B * T;
  Batch batch;
  batch.whole_sequences(B, T);
  for (int64_t i = 0; i < N; ++i)
    batch.tokens[size_t(i)] = int32_t((i * 7 + 2) % c.vocab_size),
    batch.targets[size_t(i)] = int32_t((i * 3 + 1) % c.vocab_size);
  auto run = [&](bool recompute) {
    Transformer model(c, p, 11);
    model.set_selective_recompute(selective);
    model.prepare(B, T, {2});
    model.params().grads().zero();
    const int head = model.n_units() - 1;
    for (int slot = 0; slot < 2; ++slot)
      for (int u = 0; u <= head; ++u) {
        model.forward_unit(u, slot, batch, 1.0f / float(2 * N));
        if (recompute && model.units()[size_t(u)].kind == Transformer::UnitKind::block)
          model.release_saved(u, slot);
      }
    std::vector<float> losses(model.losses(0), model.losses(0) + N);
    for (int slot = 1; slot >= 0; --slot)
      for (int u = head; u >= 0; --u) {
        if (recompute && model.units()[size_t(u)].kind == Transformer::UnitKind::block)
          model.recompute(u, slot);
        model.backward_unit(u, slot);
      }
    ParamStore& store = model.params();
    std::vector<float> grads(store.grads().data(), store.grads().data() + store.total());
    return std::make_pair(losses, grads);
  };
  const auto kept = run(false), recomputed = run(true);
  EXPECT_EQ(0, std::memcmp(kept.first.data(), recomputed.first.data(), kept.first.size() * 4));
  ASSERT_EQ(kept.second.size(), recomputed.second.size());
  EXPECT_EQ(0, std::memcmp(kept.second.data(), recomputed.second.data(), kept.second.size() * 4));
  double norm = 0;
  for (float v : kept.second) norm += double(v) * v;
  EXPECT_GT(norm, 0.0);  // the gradients compared are not all zero
}

TEST(ModelRecompute, BitwiseGpt2) { check_recompute(Family::gpt2, Precision::fp32, false); }
TEST(ModelRecompute, BitwiseLlama) { check_recompute(Family::llama, Precision::fp32, false); }
TEST(ModelRecompute, BitwiseLlamaBf16) { check_recompute(Family::llama, Precision::bf16, false); }
TEST(ModelRecompute, SelectiveBitwiseGpt2) { check_recompute(Family::gpt2, Precision::fp32, true); }
TEST(ModelRecompute, SelectiveBitwiseLlamaBf16) {
  check_recompute(Family::llama, Precision::bf16, true);
}

TEST(ModelGradients, SplitBackwardMatchesFusedGpt2) { check_split_backward(Family::gpt2); }
TEST(ModelGradients, SplitBackwardMatchesFusedLlama) { check_split_backward(Family::llama); }
TEST(ModelGradients, SplitBackwardMatchesFusedGpt2Bf16) {
  check_split_backward(Family::gpt2, Precision::bf16);
}
TEST(ModelGradients, SplitBackwardMatchesFusedLlamaBf16) {
  check_split_backward(Family::llama, Precision::bf16);
}

TEST(ModelGradients, Gpt2Block) { check_block(Family::gpt2, 4); }
TEST(ModelGradients, LlamaBlock) { check_block(Family::llama, 4); }
TEST(ModelGradients, LlamaBlockGroupedQuery) { check_block(Family::llama, 2); }
TEST(ModelGradients, LlamaBlockMultiQuery) { check_block(Family::llama, 1); }

void check_transformer(Family f, int n_kv_heads, bool tied) {
  const ModelConfig c = tiny(f, n_kv_heads, tied);
  Transformer model(c, Precision::fp32, 5);
  randomise(model.params(), 6);
  model.params().wrote_all();
  const int64_t B = 2, T = 6, N = B * T;
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = int32_t((i * 5 + 3) % c.vocab_size), targets[i] = int32_t((i * 11 + 1) % c.vocab_size);
  auto loss = [&] {
    model.forward(tokens.data(), targets.data(), B, T, 0.0f);
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += model.losses()[i];
    return s / double(N);
  };
  ParamStore& store = model.params();
  store.grads().zero();
  model.forward(tokens.data(), targets.data(), B, T, 1.0f / float(N));
  model.backward();
  for (int i = 0; i < int(store.tensors().size()); ++i)
    expect_fd(store.tensor(i).name.c_str(), store.value(i), store.grad(i), store.tensor(i).numel,
              loss, [&] { model.params().wrote_all(); }, 4);
}

// The loss mask: a masked token's loss is 0 and the gradient is that of the mean over the tokens
// that count, checked by finite differences; positions restarting mid-sequence (a second document)
// reach RoPE and the learned positions.
void check_masked(Family f) {
  const ModelConfig c = tiny(f, 2, false);
  Transformer model(c, Precision::fp32, 5);
  randomise(model.params(), 6);
  model.params().wrote_all();
  const int64_t B = 2, T = 6, N = B * T;
  Batch batch;
  batch.whole_sequences(B, T);
  for (int64_t i = 0; i < N; ++i) {
    batch.tokens[size_t(i)] = int32_t((i * 5 + 3) % c.vocab_size);
    batch.targets[size_t(i)] = int32_t((i * 11 + 1) % c.vocab_size);
    batch.positions[size_t(i)] = int32_t(i % T < 4 ? i % T : i % T - 4);
    batch.loss_mask[size_t(i)] = i % 3 != 1;
  }
  batch.valid_tokens = N - 4;
  auto loss = [&] {
    model.forward(batch, 0.0f);
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += model.losses()[i];
    return s / double(batch.valid_tokens);
  };
  loss();
  for (int64_t i = 1; i < N; i += 3) EXPECT_EQ(model.losses()[i], 0.0f) << "token " << i;
  ParamStore& store = model.params();
  store.grads().zero();
  model.forward(batch, 1.0f / float(batch.valid_tokens));
  model.backward();
  for (int i = 0; i < int(store.tensors().size()); ++i)
    expect_fd(store.tensor(i).name.c_str(), store.value(i), store.grad(i), store.tensor(i).numel,
              loss, [&] { model.params().wrote_all(); }, 4);
}

TEST(ModelGradients, MaskedAndRestartingGpt2) { check_masked(Family::gpt2); }
TEST(ModelGradients, MaskedAndRestartingLlama) { check_masked(Family::llama); }

// Document masking: with the batch's documents, a token's logits do not depend on the tokens of an
// earlier document, bit for bit; without them they do.
void check_document_isolation(Family f) {
  const ModelConfig c = tiny(f, 2, false);
  Transformer model(c, Precision::fp32, 7);
  const int64_t T = 12, first = 5;  // document 0: tokens 0 .. 4, document 1: 5 .. 11
  Batch batch;
  batch.whole_sequences(1, T);
  for (int64_t i = 0; i < T; ++i) {
    batch.tokens[size_t(i)] = int32_t((i * 3 + 1) % c.vocab_size);
    batch.targets[size_t(i)] = int32_t((i * 5 + 2) % c.vocab_size);
  }
  const int64_t V = c.vocab_size;
  auto second_document = [&](bool documents) {
    batch.documents.clear();
    if (documents)
      for (int64_t i = 0; i < T; ++i) batch.documents.push_back(i < first ? 0 : 1);
    model.forward(batch, 0.0f);
    return std::vector<float>(model.logits() + first * V, model.logits() + T * V);
  };
  const std::vector<float> masked = second_document(true), unmasked = second_document(false);
  for (int64_t i = 0; i < first; ++i) batch.tokens[size_t(i)] = int32_t((i * 7 + 4) % c.vocab_size);
  EXPECT_EQ(second_document(true), masked);
  EXPECT_NE(second_document(false), unmasked);
}

TEST(ModelDocuments, LaterDocumentIgnoresEarlierGpt2) { check_document_isolation(Family::gpt2); }
TEST(ModelDocuments, LaterDocumentIgnoresEarlierLlama) { check_document_isolation(Family::llama); }

TEST(ModelGradients, Gpt2TransformerTied) { check_transformer(Family::gpt2, 4, true); }
TEST(ModelGradients, Gpt2TransformerUntied) { check_transformer(Family::gpt2, 4, false); }
TEST(ModelGradients, LlamaTransformerGqaUntied) { check_transformer(Family::llama, 2, false); }
TEST(ModelGradients, LlamaTransformerTied) { check_transformer(Family::llama, 4, true); }

TEST(ModelInit, SliceIndependentOfOtherTensors) {
  // A tensor's values depend only on (seed, name, index): a model with more layers holds the
  // same first layer.
  ModelConfig a = tiny(Family::gpt2, 4, true), b = a;
  b.n_layers = 3;
  Transformer ma(a, Precision::fp32, 9), mb(b, Precision::fp32, 9);
  const int ia = ma.params().find("blocks.0.attn.qkv.weight");
  const int ib = mb.params().find("blocks.0.attn.qkv.weight");
  ASSERT_GE(ia, 0);
  ASSERT_GE(ib, 0);
  const int64_t n = ma.params().tensor(ia).numel;
  EXPECT_EQ(0, std::memcmp(ma.params().value(ia), mb.params().value(ib), n * sizeof(float)));
  Transformer mc(a, Precision::fp32, 10);
  EXPECT_NE(0, std::memcmp(ma.params().value(ia), mc.params().value(ia), n * sizeof(float)));
}

}  // namespace
}  // namespace cleave
