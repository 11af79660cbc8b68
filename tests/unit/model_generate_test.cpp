// Inference through the paged key/value cache: the logits of the trainer's forward pass, bit for
// bit, and the same for a sequence alone or in any batch; a bf16 cache near them, batch
// invariant too; the block pool; sampling follows temperature and top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "cleave/kernels/linear.h"
#include "cleave/model/generate.h"

namespace cleave {
namespace {

ModelConfig tiny(Family family, bool moe = false) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 31;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = family == Family::llama ? 2 : 4;
  c.ffn_hidden = 64;
  c.max_seq_len = 160;
  c.tie_embeddings = family == Family::gpt2;
  c.init_std = 0.2f;
  if (moe) c.moe_experts = 4, c.moe_top_k = 2, c.moe_ffn_hidden = 48;
  return c;
}

std::vector<int32_t> some_tokens(int64_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

// One ragged step: each sequence's next `rows` tokens after what its cache holds, the logits of
// its last row.
struct Step {
  std::vector<int32_t> tokens;
  std::vector<std::pair<SequenceCache*, int64_t>> seqs;  // (cache, rows)
};

std::vector<float> run_step(Transformer& model, KvPool& pool, const Step& step) {
  Batch b;
  b.cache_rows = {0};
  size_t at = 0;
  for (auto [cache, rows] : step.seqs) {
    reserve_tokens(pool, *cache, cache->length + rows);
    for (int64_t t = 0; t < rows; ++t) {
      b.tokens.push_back(step.tokens[at++]);
      b.positions.push_back(int32_t(cache->length + t));
    }
    b.cache_past.push_back(cache->length);
    b.cache_blocks.push_back(cache->blocks);
    b.cache_rows.push_back(int64_t(b.tokens.size()));
    b.logit_rows.push_back(int64_t(b.tokens.size()) - 1);
    cache->length += rows;
  }
  b.B = 1, b.T = int64_t(b.tokens.size());
  const float* logits = model.forward_cached(b, pool);
  return std::vector<float>(logits, logits + b.logit_rows.size() * model.config().vocab_size);
}

// The logits through the cache are the trainer's forward's, bit for bit, whether the prompt goes
// in at once, in chunks, or a token at a time, where the trainer's per-row-count products give a
// row the bits of the cache path's (AVX-512). On a CPU without AVX-512 (Zen 3) the trainer's rows
// take bits that change with the row count, the cache path's those of their 16-row tiles: there
// they agree to rounding (the cache path's own batch invariance is bitwise everywhere, below).
void check_cache_matches_full_forward(Family family, Precision precision) {
  const bool bitwise = row_invariant_products(Precision::fp32);
  const ModelConfig c = tiny(family);
  Transformer model(c, precision, 4);
  const int64_t T = 150;  // past two key blocks
  const std::vector<int32_t> tokens = some_tokens(T, c.vocab_size, 3);
  std::vector<int32_t> targets(T, 0);
  model.forward(tokens.data(), targets.data(), 1, T, 0.0f);
  const std::vector<float> full(model.logits(), model.logits() + T * c.vocab_size);
  for (int64_t chunk : {T, int64_t(70), int64_t(1)}) {
    KvPool pool = model.new_pool(8);
    SequenceCache seq;
    for (int64_t t = 0; t < T;) {
      const int64_t n = std::min(chunk, T - t);
      Step step{{tokens.begin() + t, tokens.begin() + t + n}, {{&seq, n}}};
      const std::vector<float> logits = run_step(model, pool, step);
      t += n;
      const float* want = &full[size_t((t - 1) * c.vocab_size)];
      if (bitwise) {
        ASSERT_EQ(0, std::memcmp(logits.data(), want, c.vocab_size * sizeof(float)))
            << "chunks of " << chunk << ", position " << t - 1;
        continue;
      }
      for (int64_t v = 0; v < c.vocab_size; ++v)
        ASSERT_NEAR(logits[size_t(v)], want[v], 1e-4f * (1.0f + std::fabs(want[v])))
            << "chunks of " << chunk << ", position " << t - 1 << ", logit " << v;
    }
  }
}

TEST(Generate, CacheMatchesTrainerForwardBitwiseGpt2) {
  check_cache_matches_full_forward(Family::gpt2, Precision::fp32);
}
TEST(Generate, CacheMatchesTrainerForwardBitwiseLlama) {
  check_cache_matches_full_forward(Family::llama, Precision::fp32);
}
TEST(Generate, CacheMatchesTrainerForwardBitwiseLlamaBf16) {
  check_cache_matches_full_forward(Family::llama, Precision::bf16);
}

// Batch invariance: a sequence's logits are the same alone, among 15 others, and at another
// place in the batch, bit for bit.
void check_batch_invariance(Family family, Precision precision, bool moe = false,
                            KvDtype kv = KvDtype::fp32) {
  const ModelConfig c = tiny(family, moe);
  Transformer model(c, precision, 5);
  const std::vector<int32_t> prompt = some_tokens(90, c.vocab_size, 11);
  auto logits_of = [&](int others, int place) {
    KvPool pool = model.new_pool(64, kernels::kAttentionKeyBlock, kv);
    std::vector<SequenceCache> caches(size_t(others) + 1);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i <= others; ++i)
      prompts.push_back(i == place ? prompt : some_tokens(1 + 13 * i % 120, c.vocab_size, 20 + i));
    // Prefill every sequence in one ragged batch, then one decode token each.
    std::vector<std::vector<float>> out(2);
    for (int phase = 0; phase < 2; ++phase) {
      Step step;
      for (int i = 0; i <= others; ++i) {
        const std::vector<int32_t>& p = prompts[size_t(i)];
        if (phase == 0) step.tokens.insert(step.tokens.end(), p.begin(), p.end());
        else step.tokens.push_back(p.front());
        step.seqs.push_back({&caches[size_t(i)], phase == 0 ? int64_t(p.size()) : 1});
      }
      const std::vector<float> all = run_step(model, pool, step);
      out[size_t(phase)].assign(all.begin() + place * c.vocab_size,
                                all.begin() + (place + 1) * c.vocab_size);
    }
    return out;
  };
  const auto alone = logits_of(0, 0);
  for (auto [others, place] : {std::pair{15, 0}, std::pair{15, 9}, std::pair{3, 3}}) {
    const auto among = logits_of(others, place);
    for (int phase = 0; phase < 2; ++phase)
      EXPECT_EQ(0, std::memcmp(alone[size_t(phase)].data(), among[size_t(phase)].data(),
                               c.vocab_size * sizeof(float)))
          << (phase ? "decode" : "prefill") << " logits among " << others << " others at place "
          << place;
  }
}

TEST(Generate, BatchInvarianceGpt2) { check_batch_invariance(Family::gpt2, Precision::fp32); }
TEST(Generate, BatchInvarianceLlama) { check_batch_invariance(Family::llama, Precision::fp32); }
TEST(Generate, BatchInvarianceGpt2Bf16) { check_batch_invariance(Family::gpt2, Precision::bf16); }
TEST(Generate, BatchInvarianceLlamaBf16) { check_batch_invariance(Family::llama, Precision::bf16); }
// An expert's rows depend on the batch: its products pad them to whole row tiles.
TEST(Generate, BatchInvarianceMoe) { check_batch_invariance(Family::llama, Precision::fp32, true); }
TEST(Generate, BatchInvarianceMoeBf16) {
  check_batch_invariance(Family::llama, Precision::bf16, true);
}
TEST(Generate, BatchInvarianceBf16Cache) {
  check_batch_invariance(Family::llama, Precision::fp32, false, KvDtype::bf16);
  check_batch_invariance(Family::gpt2, Precision::bf16, false, KvDtype::bf16);
}

// A bf16 cache: half the bytes a token, the logits near the fp32 cache's (its keys and values
// rounded to 8 bits of mantissa) but not theirs, prompt at once or a token at a time alike.
TEST(Generate, Bf16CacheIsNearTheFp32Cache) {
  const ModelConfig c = tiny(Family::llama);
  Transformer model(c, Precision::fp32, 4);
  EXPECT_EQ(model.kv_bytes_per_token(KvDtype::bf16) * 2, model.kv_bytes_per_token(KvDtype::fp32));
  const int64_t T = 150;
  const std::vector<int32_t> tokens = some_tokens(T, c.vocab_size, 3);
  auto logits_of = [&](KvDtype kv, int64_t chunk) {
    KvPool pool = model.new_pool(8, kernels::kAttentionKeyBlock, kv);
    EXPECT_EQ(pool.dtype(), kv);
    SequenceCache seq;
    std::vector<float> all;
    for (int64_t t = 0; t < T; t += chunk) {
      const std::vector<float> l = run_step(model, pool, {{tokens.begin() + t, tokens.begin() + t + chunk}, {{&seq, chunk}}});
      all.insert(all.end(), l.begin(), l.end());
    }
    return all;
  };
  const std::vector<float> fp32 = logits_of(KvDtype::fp32, 1), bf16 = logits_of(KvDtype::bf16, 1);
  float most = 0, scale = 0;
  for (size_t i = 0; i < fp32.size(); ++i)
    most = std::max(most, std::abs(fp32[i] - bf16[i])), scale = std::max(scale, std::abs(fp32[i]));
  EXPECT_GT(most, 0.0f) << "the bf16 cache gave the fp32 cache's logits: not rounded";
  EXPECT_LT(most, 2e-2f * scale) << "largest logit " << scale;
  // The last position's logits from a prompt in chunks of 75 (prefill's tasks) are a decode's.
  const std::vector<float> chunked = logits_of(KvDtype::bf16, 75);
  EXPECT_EQ(0, std::memcmp(&chunked[size_t(c.vocab_size)], &bf16[size_t((T - 1) * c.vocab_size)],
                           c.vocab_size * sizeof(float)));
}

// generate_batch gives each prompt what generate gives it alone with its seed, greedy and sampled,
// with the prompts prefilled at once or in chunks.
TEST(Generate, BatchOfPromptsMatchesEachAlone) {
  const ModelConfig c = tiny(Family::llama);
  Transformer model(c, Precision::fp32, 6);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(some_tokens(1 + 17 * i, c.vocab_size, 40 + i));
  // Without a stop token every sequence runs 12 steps; with one that prompt 2 draws early (its
  // 4th token), sequences end at different steps and the batch shrinks under the others.
  for (auto [stop, temperature] : {std::pair{false, 0.0f}, {false, 1.0f}, {true, 1.0f}}) {
    SamplingOptions o;
    o.max_new_tokens = 12, o.temperature = temperature, o.seed = 9;
    const auto alone_with = [&](const SamplingOptions& with) {
      std::vector<std::vector<int32_t>> alone;
      for (size_t i = 0; i < prompts.size(); ++i) {
        SamplingOptions own = with;
        own.seed = with.seed + i;  // prompt i of a batch draws with seed + i
        alone.push_back(generate(model, prompts[i], own));
      }
      return alone;
    };
    if (stop) o.stop_token = alone_with(o)[2][3];
    const auto alone = alone_with(o);
    o.prefill_chunk = 16;
    const auto together = generate_batch(model, prompts, o);
    ASSERT_EQ(together.size(), prompts.size());
    size_t shortest = 12;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(alone[i], together[i]) << "prompt " << i << " at temperature " << temperature
                                       << (stop ? " with a stop token" : "");
      shortest = std::min(shortest, together[i].size());
    }
    if (stop) EXPECT_LT(shortest, 12u);
    else EXPECT_EQ(shortest, 12u);
  }
}

// A request whose cache the machine cannot hold is refused before anything runs (here 32 TiB).
TEST(Generate, CacheLargerThanTheMachineIsRefused) {
  ModelConfig c = tiny(Family::llama);
  c.max_seq_len = 1 << 24;
  Transformer model(c, Precision::fp32, 7);
  SamplingOptions o;
  o.max_new_tokens = 1 << 24;
  try {
    generate_batch(model, std::vector<std::vector<int32_t>>(4096, {1, 2}), o);
    FAIL() << "a 32 TiB cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("this rank has of its host's memory"), std::string::npos)
        << e.what();
  }
}

// A ragged batch that would read or write outside a buffer is refused before any unit runs.
TEST(Generate, BadRaggedBatchesAreRefused) {
  const ModelConfig c = tiny(Family::llama);
  Transformer model(c, Precision::fp32, 8);
  KvPool pool = model.new_pool(4);
  SequenceCache seq;
  reserve_tokens(pool, seq, 3);
  Batch good;
  good.B = 1, good.T = 3;
  good.tokens = {1, 2, 3}, good.positions = {0, 1, 2};
  good.cache_rows = {0, 3}, good.cache_past = {0};
  good.cache_blocks = {seq.blocks};
  good.logit_rows = {2};
  model.forward_cached(good, pool);
  const std::vector<int32_t> stranger = {3}, none;
  const std::vector<std::pair<const char*, std::function<void(Batch&)>>> cases = {
      {"more logit rows than rows", [](Batch& b) { b.logit_rows = {2, 2, 2, 2}; }},
      {"a logit row outside", [](Batch& b) { b.logit_rows = {3}; }},
      {"a negative past", [](Batch& b) { b.cache_past = {-64}, b.positions = {-64, -63, -62}; }},
      {"a block not in use", [&](Batch& b) { b.cache_blocks = {stranger}; }},
      {"no block", [&](Batch& b) { b.cache_blocks = {none}; }},
      {"a token outside the vocabulary", [&](Batch& b) { b.tokens[1] = c.vocab_size; }},
      {"positions that do not follow", [](Batch& b) { b.positions[2] = 5; }},
      {"rows that do not cover the batch", [](Batch& b) { b.cache_rows = {0, 2}; }},
  };
  for (const auto& [what, spoil] : cases) {
    Batch bad = good;
    spoil(bad);
    EXPECT_THROW(model.forward_cached(bad, pool), Error) << what;
  }
}

TEST(Generate, PoolAllocatesSharesAndFrees) {
  KvPool pool(2, 8, 64, 4);
  EXPECT_EQ(pool.free_blocks(), 4);
  SequenceCache a;
  reserve_tokens(pool, a, 100);  // two blocks
  ASSERT_EQ(a.blocks.size(), 2u);
  EXPECT_EQ(pool.free_blocks(), 2);
  // Rows written to the second block, then shared by b at 70 tokens: both hold both blocks.
  a.length = 100;
  KvLayer l1 = pool.layer(1);
  l1.k[a.blocks[1] * 64 * 8 + 3 * 64 + 5] = 42.0f;  // token 69's key column 3 (keys transposed)
  l1.v[(a.blocks[1] * 64 + 5) * 8 + 3] = 43.0f;
  SequenceCache b = share_prefix(pool, a, 70);
  EXPECT_EQ(pool.refs(a.blocks[0]), 2);
  EXPECT_EQ(pool.refs(a.blocks[1]), 2);
  // b writes its token 70, in the shared second block: it gets a copy of the block first.
  reserve_tokens(pool, b, 71);
  EXPECT_NE(b.blocks[1], a.blocks[1]);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);
  EXPECT_EQ(pool.refs(a.blocks[1]), 1);
  EXPECT_EQ(l1.k[b.blocks[1] * 64 * 8 + 3 * 64 + 5], 42.0f);  // its tokens below 70 came along
  EXPECT_EQ(l1.v[(b.blocks[1] * 64 + 5) * 8 + 3], 43.0f);
  EXPECT_EQ(pool.free_blocks(), 1);
  // Exhaustion is an error that says so, and takes nothing.
  SequenceCache c;
  try {
    reserve_tokens(pool, c, 130);
    FAIL() << "a pool of 1 free block held 130 tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold 130 tokens"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_TRUE(c.blocks.empty());
  release_sequence(pool, a);
  EXPECT_EQ(pool.refs(b.blocks[0]), 1);
  release_sequence(pool, b);
  EXPECT_EQ(pool.free_blocks(), 4);
  EXPECT_THROW(pool.release(0), Error);  // not in use
  EXPECT_THROW(KvPool(2, 8, 48, 4), Error);  // blocks must hold whole key blocks
}

// A bf16 pool copies a shared block's rows as the fp32 one does.
TEST(Generate, Bf16PoolCopiesSharedBlocks) {
  KvPool pool(2, 8, 64, 4, KvDtype::bf16);
  SequenceCache a;
  reserve_tokens(pool, a, 100);
  a.length = 100;
  KvLayer l1 = pool.layer(1);
  ASSERT_TRUE(l1.k_bf16 && l1.v_bf16 && !l1.k && !l1.v);
  l1.k_bf16[a.blocks[1] * 64 * 8 + 3 * 64 + 5] = to_bf16(42.0f);
  l1.v_bf16[(a.blocks[1] * 64 + 5) * 8 + 3] = to_bf16(43.0f);
  SequenceCache b = share_prefix(pool, a, 70);
  reserve_tokens(pool, b, 71);
  ASSERT_NE(b.blocks[1], a.blocks[1]);
  EXPECT_EQ(from_bf16(l1.k_bf16[b.blocks[1] * 64 * 8 + 3 * 64 + 5]), 42.0f);
  EXPECT_EQ(from_bf16(l1.v_bf16[(b.blocks[1] * 64 + 5) * 8 + 3]), 43.0f);
  EXPECT_EQ(kv_dtype_bytes(KvDtype::bf16), 2);
  EXPECT_THROW(parse_kv_dtype("fp16", "fp32", "--kv-cache-dtype"), Error);
  EXPECT_EQ(parse_kv_dtype("auto", "bf16", "--kv-cache-dtype"), KvDtype::bf16);
  EXPECT_EQ(parse_kv_dtype("fp32", "bf16", "--kv-cache-dtype"), KvDtype::fp32);
}

TEST(Generate, SamplingRules) {
  const float logits[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(sample_token(logits, 5, 0.0f, 0, 0.5f), 1);  // greedy: first maximum
  for (float u : {0.01f, 0.3f, 0.6f, 0.99f}) {
    const int32_t t = sample_token(logits, 5, 1.0f, 2, u);  // top-2: tokens 1 and 3 only
    EXPECT_TRUE(t == 1 || t == 3) << u;
  }
  EXPECT_EQ(sample_token(logits, 5, 1.0f, 2, 0.01f), 1);
  EXPECT_EQ(sample_token(logits, 5, 1.0f, 2, 0.99f), 3);
  // Full vocabulary at high temperature reaches the last token at the top of the range.
  EXPECT_EQ(sample_token(logits, 5, 100.0f, 0, 1.0f), 4);
}

// The draws of a grid of n uniforms, counted per token.
std::vector<double> draw_shares(const std::vector<float>& logits, float temperature, int top_k,
                                float top_p, int n) {
  std::vector<double> share(logits.size(), 0.0);
  for (int i = 1; i <= n; ++i)
    share[size_t(sample_token(logits.data(), int(logits.size()), temperature, top_k,
                              float(i) / float(n), top_p))] += 1.0 / n;
  return share;
}

// Every token a candidate (drawn over the ids in order), a top-k cut and a nucleus (sorted only
// as far as it needs, here past its first 64) give each token its share of the softmax.
TEST(Generate, SamplingFollowsTheDistribution) {
  std::vector<float> logits(1000);
  uint32_t x = 12345;
  for (float& l : logits) l = float((x = x * 1664525u + 1013904223u) >> 8) / float(1 << 24) * 3.0f;
  const float temperature = 0.7f;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
  });
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::exp(double(logits[i]) / temperature);
  struct Cut {
    int top_k;
    float top_p;
  };
  for (const Cut cut : {Cut{0, 1.0f}, Cut{40, 1.0f}, Cut{0, 0.5f}, Cut{100, 0.9f}}) {
    // The reference: the highest first, the top k of them, then the fewest reaching top_p.
    const size_t k = cut.top_k > 0 ? size_t(cut.top_k) : p.size();
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += p[size_t(order[i])];
    size_t kept = 0;
    double mass = 0;
    while (kept < k && mass < double(cut.top_p) * sum) mass += p[size_t(order[kept++])];
    if (cut.top_p == 0.5f) {
      EXPECT_GT(kept, 64u) << "the nucleus must outgrow the first sort";
    }
    std::vector<double> want(p.size(), 0.0);
    for (size_t i = 0; i < kept; ++i) want[size_t(order[i])] = p[size_t(order[i])] / mass;
    // A grid of n uniforms gives each token its interval's length within 1 / n.
    const int n = 20000;
    const std::vector<double> got = draw_shares(logits, temperature, cut.top_k, cut.top_p, n);
    for (size_t t = 0; t < p.size(); ++t)
      ASSERT_NEAR(got[t], want[t], 1.5 / n + want[t] * 1e-3)
          << "token " << t << ", top_k " << cut.top_k << ", top_p " << cut.top_p;
  }
}

}  // namespace
}  // namespace cleave
