// Generation: decoding through the key/value cache gives the logits of a full forward pass, and
// sampling follows temperature and top-k.
#include <gtest/gtest.h>

#include <cmath>

#include "cleave/model/generate.h"

namespace cleave {
namespace {

void check_cache_matches_full_forward(Family family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 31;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = family == Family::llama ? 2 : 4;
  c.ffn_hidden = 64;
  c.max_seq_len = 16;
  c.tie_embeddings = family == Family::gpt2;
  c.init_std = 0.2f;
  Transformer model(c, Precision::fp32, 4);
  const std::vector<int32_t> tokens = {3, 17, 5, 29, 0, 11, 8};
  const int64_t T = int64_t(tokens.size());
  std::vector<int32_t> targets(T, 0);
  model.forward(tokens.data(), targets.data(), 1, T, 0.0f);
  std::vector<float> full(model.logits(), model.logits() + T * c.vocab_size);
  auto cache = model.new_cache(T);
  // A prompt of 3 tokens at once, then one token at a time.
  const float* logits = model.forward_cached(tokens.data(), 3, cache);
  for (int64_t t = 2; t < T; ++t) {
    if (t > 2) logits = model.forward_cached(&tokens[t], 1, cache);
    for (int v = 0; v < c.vocab_size; ++v)
      EXPECT_NEAR(logits[v], full[t * c.vocab_size + v], 1e-4) << "position " << t << " token " << v;
  }
}

TEST(Generate, CacheMatchesFullForwardGpt2) { check_cache_matches_full_forward(Family::gpt2); }
TEST(Generate, CacheMatchesFullForwardLlama) { check_cache_matches_full_forward(Family::llama); }

TEST(Generate, SamplingRules) {
  const float logits[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(sample_token(logits, 5, 0.0f, 0, 0.5f), 1);  // greedy: first maximum
  for (float u : {0.01f, 0.3f, 0.6f, 0.99f}) {
    const int32_t t = sample_token(logits, 5, 1.0f, 2, u);  // top-2: tokens 1 and 3 only
    EXPECT_TRUE(t == 1 || t == 3) << u;
  }
  EXPECT_EQ(sample_token(logits, 5, 1.0f, 2, 0.01f), 1);
  EXPECT_EQ(sample_token(logits, 5, 1.0f, 2, 0.99f), 3);
  // Full vocabulary at high temperature reaches the least likely token at the top of the range.
  EXPECT_EQ(sample_token(logits, 5, 100.0f, 0, 1.0f), 4);
}

}  // namespace
}  // namespace cleave
