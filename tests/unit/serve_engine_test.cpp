// The server's engine: continuous batching gives each request what it gets alone (generate's
// tokens, with any step budget, beside any other requests, through preemption and shared
// prefixes); its log-probabilities are the trainer's, bit for bit; a full pool queues requests;
// a cancelled request gives its blocks back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "cleave/kernels/linear.h"
#include "cleave/model/generate.h"
#include "cleave/serve/engine.h"

namespace cleave::serve {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.family = Family::llama;
  c.vocab_size = 37;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 64;
  c.max_seq_len = 400;
  c.init_std = 0.3f;
  return c;
}

std::vector<int32_t> some_tokens(int64_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs, prompt_logprobs;
  Finish finish = Finish::none;
};

// Steps the engine until every request has ended; each request's events collected.
std::vector<Result> run(Engine& engine, std::vector<std::shared_ptr<Request>> reqs,
                        const std::function<void(int)>& each_step = {}) {
  std::vector<Result> out(reqs.size());
  for (int step = 0;; ++step) {
    const bool worked = engine.step();
    if (each_step) each_step(step);
    bool all = true;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Event e;
      while (out[i].finish == Finish::none && reqs[i]->next(e, std::chrono::milliseconds(0))) {
        if (e.finish != Finish::none) out[i].finish = e.finish;
        else if (e.prompt) out[i].prompt_logprobs.push_back(e.logprob);
        else out[i].tokens.push_back(e.token), out[i].logprobs.push_back(e.logprob);
      }
      all = all && out[i].finish != Finish::none;
    }
    if (all) return out;
    EXPECT_TRUE(worked) << "the engine idles with requests unfinished";
    if (!worked) return out;
  }
}

Sampling greedy(int n) {
  Sampling s;
  s.max_tokens = n, s.temperature = 0.0f, s.logprobs = 0;
  return s;
}

TEST(ServeEngine, EachRequestGetsWhatGenerateGivesItAlone) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 3);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 17; ++i) prompts.push_back(some_tokens(1 + 23 * i % 150, c.vocab_size, 50 + i));
  Sampling s = greedy(12);
  s.temperature = 0.9f, s.top_k = 8, s.seed = 77;
  // generate's draws, one prompt alone at a time (prompt i with seed 77: generate_batch's
  // prompt 0).
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    SamplingOptions g;
    g.max_new_tokens = 12, g.temperature = 0.9f, g.top_k = 8, g.seed = 77;
    alone.push_back(generate(model, p, g));
  }
  // Every request at once, in steps of 40 tokens (prompts prefilled over several steps while
  // others decode), then the first alone.
  for (int64_t budget : {int64_t(40), int64_t(1000)}) {
    EngineOptions o;
    o.kv_blocks = 64, o.step_tokens = budget;
    Engine engine(model, o);
    std::vector<std::shared_ptr<Request>> reqs;
    for (const auto& p : prompts) reqs.push_back(engine.submit(p, s));
    const std::vector<Result> got = run(engine, reqs);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i << ", step budget " << budget;
      EXPECT_EQ(got[i].finish, Finish::length);
    }
  }
}

// The warm-up runs a forward at each row count a step can have (1-32, then multiples of 16 up to
// the budget's) and gives back every block it took; requests then get what they get alone.
TEST(ServeEngine, WarmUpRunsEveryRowCountAndTakesNothing) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 6);
  const std::vector<int32_t> prompt = some_tokens(70, c.vocab_size, 8);
  SamplingOptions g;
  g.max_new_tokens = 6, g.temperature = 0.0f;
  const std::vector<int32_t> alone = generate(model, prompt, g);
  for (const auto& [budget, counts] : {std::pair{int64_t(100), int64_t(37)}, {int64_t(20), int64_t(20)}}) {
    EngineOptions o;
    o.kv_blocks = 8, o.step_tokens = budget;
    Engine engine(model, o);
    const EngineStats before = engine.stats();
    EXPECT_EQ(engine.warm_up(), counts) << "budget " << budget;
    // Each count timed (the prompt rows' hold reads them).
    EXPECT_EQ(int64_t(engine.forward_seconds().size()), counts);
    for (const auto& [rows, seconds] : engine.forward_seconds()) EXPECT_GT(seconds, 0) << rows;
    engine.step();  // publishes the stats
    EXPECT_EQ(engine.stats().blocks_used, before.blocks_used);
    EXPECT_EQ(engine.stats().steps, 0);
    EXPECT_EQ(run(engine, {engine.submit(prompt, greedy(6))})[0].tokens, alone);
  }
}

// serve.max_step_ratio: beside running decodes, a step takes only the prompt rows whose forward
// keeps it within the ratio of the forward of a step in which every request (running or queued)
// decodes (by the forward's time per row count: here (10 + rows) / 1024 s, exact in binary so
// that no bound rests on rounding). Without decodes a prompt has the whole budget; the tokens are
// the same either way.
TEST(ServeEngine, PromptRowsHeldToTheStepRatio) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 4);
  std::map<int64_t, double> seconds;
  for (int64_t rows = 1; rows <= 32; ++rows) seconds[rows] = (10.0 + double(rows)) / 1024;
  for (int64_t rows : {64, 96, 128}) seconds[rows] = (10.0 + double(rows)) / 1024;
  const std::vector<int32_t> long_prompt = some_tokens(300, c.vocab_size, 9);
  std::vector<std::vector<int32_t>> tokens_at_ratio;
  for (const double ratio : {2.0, 1.0, 0.0}) {
    EngineOptions o;
    o.kv_blocks = 64, o.step_tokens = 128, o.max_step_ratio = ratio;
    Engine engine(model, o);
    engine.set_forward_seconds(seconds);
    if (ratio == 2) {
      // 4 requests: 14 ms decoding, so up to 28 ms: 18 rows. 16: 26 ms, up to 52: 32 rows (the
      // next count, 64, takes 74). 40 pad to 64 (74 ms): 128 rows fit in 148.
      EXPECT_EQ(engine.step_rows_for(4), 18);
      EXPECT_EQ(engine.step_rows_for(16), 32);
      EXPECT_EQ(engine.step_rows_for(40), 128);
      // 96 rows timed fast by chance: 16 requests still stop at 64's 74 ms.
      std::map<int64_t, double> noisy = seconds;
      noisy[96] = 20.0 / 1024;
      engine.set_forward_seconds(noisy);
      EXPECT_EQ(engine.step_rows_for(16), 32);
      engine.set_forward_seconds(seconds);
    }
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 4; ++i) reqs.push_back(engine.submit(some_tokens(3, c.vocab_size, 20 + i), greedy(40)));
    for (int i = 0; i < 3; ++i) engine.step();  // the 4 are decoding
    reqs.push_back(engine.submit(long_prompt, greedy(4)));
    int64_t before = engine.stats().lane_tokens[0], most = 0;
    for (int i = 0; i < 5; ++i) {
      engine.step();
      most = std::max(most, engine.stats().lane_tokens[0] - before);
      before = engine.stats().lane_tokens[0];
    }
    // Held: the 4 decoding and the prompt are 5 requests, 15 ms a step of theirs decoding, so up
    // to 30 ms: 20 rows, 4 decodes and 16 prompt rows. At ratio 1 none would fit, and the prompt
    // gets Engine::kLeastPromptRows; free: 4 and 124.
    EXPECT_EQ(most, ratio == 2 ? 20 : ratio == 1 ? 4 + Engine::kLeastPromptRows : 128)
        << "ratio " << ratio;
    EXPECT_EQ(engine.stats().held_steps, ratio > 0 ? 5 : 0) << "ratio " << ratio;
    std::vector<Result> got = run(engine, reqs);
    tokens_at_ratio.push_back(got[4].tokens);
  }
  EXPECT_EQ(tokens_at_ratio[0], tokens_at_ratio[1]);
  EXPECT_EQ(tokens_at_ratio[0], tokens_at_ratio[2]);
  {
    // The queue raises the cap with the load: 4 decoding, the long prompt and 27 more waiting are
    // 32 requests, 42 ms a step of theirs decoding, so up to 84 ms: 64 rows.
    EngineOptions o;
    o.kv_blocks = 64, o.step_tokens = 128, o.max_step_ratio = 2;
    Engine engine(model, o);
    engine.set_forward_seconds(seconds);
    for (int i = 0; i < 4; ++i) engine.submit(some_tokens(3, c.vocab_size, 20 + i), greedy(40));
    for (int i = 0; i < 3; ++i) engine.step();
    engine.submit(long_prompt, greedy(4));
    for (int i = 0; i < 27; ++i) engine.submit(some_tokens(3, c.vocab_size, 40 + i), greedy(1));
    const int64_t before = engine.stats().lane_tokens[0];
    engine.step();
    EXPECT_EQ(engine.stats().lane_tokens[0] - before, 64);
  }
  // Alone, a prompt is not held.
  EngineOptions o;
  o.kv_blocks = 64, o.step_tokens = 128;
  Engine engine(model, o);
  engine.set_forward_seconds(seconds);
  engine.submit(long_prompt, greedy(2));
  engine.step();
  EXPECT_EQ(engine.stats().lane_tokens[0], 128);
  EXPECT_EQ(engine.stats().held_steps, 0);
}

TEST(ServeEngine, LogprobsAreTheTrainersBitwise) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 4);
  const int64_t T = 150;
  const std::vector<int32_t> tokens = some_tokens(T, c.vocab_size, 9);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(0);
  model.forward(tokens.data(), targets.data(), 1, T, 0.0f);
  const std::vector<float> losses(model.losses(), model.losses() + T);
  EngineOptions o;
  o.kv_blocks = 16, o.step_tokens = 70;  // the prompt in three chunks
  Engine engine(model, o);
  Sampling s = greedy(1);
  s.prompt_logprobs = true;
  // Beside another request, so that the batch holds more than this one.
  auto other = engine.submit(some_tokens(33, c.vocab_size, 1), greedy(5));
  auto req = engine.submit(tokens, s);
  const std::vector<Result> got = run(engine, {other, req});
  ASSERT_EQ(got[1].prompt_logprobs.size(), size_t(T - 1));
  // Bitwise where the trainer's products give a row the same bits at any row count (AVX-512);
  // without AVX-512 the serving products' 16-row tiles agree with them to rounding
  // (model_generate_test, check_cache_matches_full_forward).
  const bool bitwise = row_invariant_products(Precision::fp32);
  auto expect_same = [&](float got_logprob, float trainer_loss, const std::string& what) {
    if (bitwise) EXPECT_EQ(got_logprob, -trainer_loss) << what;
    else EXPECT_NEAR(got_logprob, -trainer_loss, 1e-4f * (1.0f + std::fabs(trainer_loss))) << what;
  };
  for (int64_t t = 0; t + 1 < T; ++t)
    expect_same(got[1].prompt_logprobs[size_t(t)], losses[size_t(t)],
                "prompt token " + std::to_string(t + 1));
  // The drawn token's: the same kernel on the last row.
  targets.back() = got[1].tokens.at(0);
  model.forward(tokens.data(), targets.data(), 1, T, 0.0f);
  expect_same(got[1].logprobs.at(0), model.losses()[T - 1], "the drawn token");
}

TEST(ServeEngine, FullPoolQueuesAndPreemptsWithoutChangingTokens) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(some_tokens(50 + 9 * i, c.vocab_size, 90 + i));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    EngineOptions o;
    o.kv_blocks = 8;
    Engine engine(model, o);
    alone.push_back(run(engine, {engine.submit(p, greedy(40))})[0].tokens);
  }
  // 4 blocks of 64 tokens for six requests of 90-135 tokens each (two or three blocks): some wait, and
  // running ones need blocks as they grow.
  EngineOptions o;
  o.kv_blocks = 4, o.step_tokens = 64;
  Engine engine(model, o);
  std::vector<std::shared_ptr<Request>> reqs;
  for (const auto& p : prompts) reqs.push_back(engine.submit(p, greedy(40)));
  int64_t most_waiting = 0;
  const std::vector<Result> got = run(engine, reqs, [&](int) {
    most_waiting = std::max(most_waiting, engine.stats().waiting);
    EXPECT_LE(engine.stats().blocks_used, 4);
  });
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i;
  EXPECT_GT(most_waiting, 0);
  EXPECT_GT(engine.stats().preempted, 0);
}

TEST(ServeEngine, SharedPrefixIsNotRecomputed) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 6);
  const std::vector<int32_t> prefix = some_tokens(200, c.vocab_size, 3);
  auto with_tail = [&](uint32_t seed) {
    std::vector<int32_t> p = prefix;
    for (int32_t t : some_tokens(20, c.vocab_size, seed)) p.push_back(t);
    return p;
  };
  EngineOptions o;
  o.kv_blocks = 32;
  Engine cold(model, o);
  const std::vector<int32_t> second_alone = run(cold, {cold.submit(with_tail(2), greedy(10))})[0].tokens;
  Engine engine(model, o);
  run(engine, {engine.submit(with_tail(1), greedy(10))});
  EXPECT_EQ(engine.stats().prefix_tokens, 0);
  EXPECT_EQ(engine.stats().blocks_cached, 3);  // the first request's whole blocks: 3 of 64
  const std::vector<Result> got = run(engine, {engine.submit(with_tail(2), greedy(10))});
  EXPECT_EQ(engine.stats().prefix_tokens, 192);  // three blocks shared, not computed
  EXPECT_EQ(got[0].tokens, second_alone);
}

TEST(ServeEngine, CancelledRequestFreesItsBlocks) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 7);
  EngineOptions o;
  o.kv_blocks = 8;
  Engine engine(model, o);
  auto req = engine.submit(some_tokens(100, c.vocab_size, 1), greedy(200));
  for (int i = 0; i < 3; ++i) engine.step();
  EXPECT_EQ(engine.stats().blocks_used, 2);
  req->cancel();
  engine.step();
  EXPECT_EQ(engine.stats().blocks_used, 0);  // not kept as a prefix: its client went away
  EXPECT_EQ(engine.stats().running, 0);
  Event e;
  Finish last = Finish::none;
  while (req->next(e, std::chrono::milliseconds(0))) last = e.finish;
  EXPECT_EQ(last, Finish::cancelled);
}

TEST(ServeEngine, StopTokenEndsTheRequestUnreported) {
  const ModelConfig c = tiny();
  Transformer model(c, Precision::fp32, 8);
  EngineOptions o;
  o.kv_blocks = 8;
  Engine engine(model, o);
  const std::vector<int32_t> prompt = some_tokens(10, c.vocab_size, 4);
  const std::vector<int32_t> free_run = run(engine, {engine.submit(prompt, greedy(8))})[0].tokens;
  Sampling s = greedy(8);
  s.stop_tokens = {free_run.at(3)};
  const Result got = run(engine, {engine.submit(prompt, s)})[0];
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]);
  EXPECT_EQ(got.tokens, std::vector<int32_t>(free_run.begin(), first));
  EXPECT_EQ(got.finish, Finish::stop);
}

}  // namespace
}  // namespace cleave::serve
