#include "cleave/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cleave/base/host_memory.h"
#include "cleave/base/philox.h"

namespace cleave {

int32_t sample_token(const float* logits, int vocab, float temperature, int top_k, float uniform,
                     float top_p) {
  if (temperature <= 0.0f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  const float top = *std::max_element(logits, logits + vocab);
  const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  if (k == vocab && top_p >= 1.0f) {
    // Every token a candidate: the draw walks the ids in order, O(vocab), with no sort (one per
    // token at a 128k vocabulary is milliseconds on the server's one engine thread).
    std::vector<double> p(static_cast<size_t>(vocab));
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += p[size_t(i)] = std::exp(double(logits[i] - top) / temperature);
    const double target = double(uniform) * sum;
    double acc = 0;
    for (int i = 0; i < vocab; ++i)
      if ((acc += p[size_t(i)]) >= target) return i;
    return vocab - 1;
  }
  // Highest logits first, ties by id, so the draw does not depend on the sort's stability.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  auto weight = [&](int32_t id) { return std::exp(double(logits[id] - top) / temperature); };
  std::vector<double> p;  // the sorted candidates' weights, highest first
  double sum = 0;
  int sorted = k;
  if (k == vocab) {
    // A nucleus alone: the candidates' sum over all ids, then only as many of the highest sorted
    // as the nucleus needs (sorting the whole vocabulary is what top_k's absence would cost).
    for (int i = 0; i < vocab; ++i) sum += weight(i);
    for (sorted = std::min(vocab, 64);; sorted = std::min(vocab, sorted * 4)) {
      std::partial_sort(ids.begin(), ids.begin() + sorted, ids.end(), higher);
      p.resize(static_cast<size_t>(sorted));
      double mass = 0;
      for (int i = 0; i < sorted; ++i) mass += p[size_t(i)] = weight(ids[size_t(i)]);
      if (mass >= double(top_p) * sum || sorted == vocab) break;
    }
  } else {
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
    p.resize(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) sum += p[size_t(i)] = weight(ids[size_t(i)]);
  }
  int kept = sorted;
  if (top_p < 1.0f) {
    double mass = 0;
    for (kept = 0; kept < sorted && mass < double(top_p) * sum;) mass += p[size_t(kept++)];
    sum = mass;
  }
  const double target = double(uniform) * sum;
  double acc = 0;
  for (int i = 0; i < kept; ++i)
    if ((acc += p[size_t(i)]) >= target) return ids[size_t(i)];
  return ids[size_t(kept - 1)];
}

float token_uniform(uint64_t seed, uint64_t index) {
  static const uint64_t stream = hash_name("generate");
  return philox_uniform(seed, stream, index);
}

namespace {

// One sequence being generated: its prompt, what it produced, and its tokens in the pool.
struct Sequence {
  const std::vector<int32_t>* prompt = nullptr;
  uint64_t seed = 0;
  std::vector<int32_t> out;
  SequenceCache cache;
  int64_t total = 0;  // prompt and new tokens it may reach
  bool done = false;
};

}  // namespace

std::vector<std::vector<int32_t>> generate_batch(Transformer& model,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 const SamplingOptions& o,
                                                 const std::function<void(int32_t)>& on_token,
                                                 const PromptShare& share) {
  const ModelConfig& c = model.config();
  CLEAVE_CHECK(o.max_new_tokens >= 0 && o.prefill_chunk >= 0,
               "max_new_tokens " << o.max_new_tokens << " and prefill_chunk " << o.prefill_chunk
                                 << " must not be negative");
  CLEAVE_CHECK(share.size >= 1 && share.rank >= 0 && share.rank < share.size &&
                   (share.size == 1 || share.any),
               "rank " << share.rank << " of " << share.size << " sharing the prompts");
  const int64_t block_rows = kernels::kAttentionKeyBlock;
  std::vector<Sequence> seqs(prompts.size());
  int64_t blocks = 1;  // and one for an idle rank's stand-in token
  int64_t max_prompt = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t n = int64_t(prompts[i].size());
    max_prompt = std::max(max_prompt, n);
    CLEAVE_CHECK(n > 0, "prompt " << i << " holds no token");
    CLEAVE_CHECK(n < c.max_seq_len, "prompt " << i << " of " << n
                                      << " tokens leaves no room in max_seq_len " << c.max_seq_len);
    seqs[i].prompt = &prompts[i];
    seqs[i].seed = o.seed + i;
    seqs[i].total = std::min<int64_t>(c.max_seq_len, n + o.max_new_tokens);
    seqs[i].done = o.max_new_tokens == 0 || int64_t(i) % share.size != share.rank;
    if (!seqs[i].done) blocks += (seqs[i].total + block_rows - 1) / block_rows;
  }
  const double block_bytes = double(block_rows) * double(model.kv_bytes_per_token(o.kv_dtype));
  if (o.kv_cache_mib > 0) {
    // A pool too small for the request would fill part way through it, with nothing to wait
    // for: refused now, naming what it needs.
    const int64_t fits = int64_t(o.kv_cache_mib * (1 << 20) / block_bytes);
    CLEAVE_CHECK(fits >= blocks, "a key/value cache of " << o.kv_cache_mib << " MiB holds " << fits
                                     << " blocks of " << block_rows << " tokens; this rank's "
                                     << "sequences need " << blocks << " ("
                                     << double(blocks) * block_bytes / (1 << 20) << " MiB)");
    blocks = fits;
  }
  // Its pages are taken as tokens are written: a request the machine cannot hold is refused
  // before it runs for hours and then fails.
  const double bytes = double(blocks) * block_bytes;
  const double machine = double(o.memory_bytes > 0 ? o.memory_bytes : host_memory_bytes());
  CLEAVE_CHECK(machine == 0 || bytes <= machine,
               "the key/value cache of this rank's share of " << prompts.size() << " sequences of up to "
                   << std::min<int64_t>(c.max_seq_len, max_prompt + o.max_new_tokens)
                   << " tokens takes " << int64_t(bytes / (1 << 20)) << " MiB, more than the "
                   << int64_t(machine / (1 << 20)) << " MiB this rank has of its host's memory: "
                   << "fewer sequences, new tokens or cache MiB");
  KvPool pool = model.new_pool(blocks, block_rows, o.kv_dtype);
  SequenceCache idle;
  reserve_tokens(pool, idle, 1);
  Batch batch;
  std::vector<Sequence*> logits_of;  // the sequence of each logit row
  for (;;) {
    // One step: every unfinished sequence's next prompt chunk, or its latest token.
    batch.tokens.clear(), batch.positions.clear();
    batch.cache_rows.assign(1, 0);
    batch.cache_past.clear(), batch.cache_blocks.clear(), batch.logit_rows.clear();
    logits_of.clear();
    for (Sequence& s : seqs) {
      if (s.done) continue;
      const int64_t past = s.cache.length, prompt = int64_t(s.prompt->size());
      int64_t n = 1;
      if (past < prompt) n = o.prefill_chunk > 0 ? std::min(o.prefill_chunk, prompt - past) : prompt - past;
      for (int64_t t = past; t < past + n; ++t) {
        batch.tokens.push_back(t < prompt ? (*s.prompt)[size_t(t)] : s.out[size_t(t - prompt)]);
        batch.positions.push_back(int32_t(t));
      }
      reserve_tokens(pool, s.cache, past + n);
      batch.cache_past.push_back(past);
      batch.cache_blocks.push_back(s.cache.blocks);
      batch.cache_rows.push_back(int64_t(batch.tokens.size()));
      if (past + n >= prompt) {
        batch.logit_rows.push_back(int64_t(batch.tokens.size()) - 1);
        logits_of.push_back(&s);
      }
      s.cache.length = past + n;
    }
    // The ranks sharing the prompts step together (their MoE layers exchange tokens in every
    // forward): a rank whose sequences are done runs one stand-in token, whose logits nobody
    // asks for, until all are.
    const bool work = !batch.cache_past.empty();
    if (!(share.size > 1 ? share.any(work) : work)) break;
    if (!work) {
      batch.tokens.assign(1, 0), batch.positions.assign(1, 0);
      batch.cache_rows.push_back(1);
      batch.cache_past.push_back(0);
      batch.cache_blocks.push_back(idle.blocks);
    }
    batch.B = 1, batch.T = int64_t(batch.tokens.size());
    const float* logits = model.forward_cached(batch, pool);
    for (size_t r = 0; r < logits_of.size(); ++r) {
      Sequence& s = *logits_of[r];
      const float u = token_uniform(s.seed, s.out.size());
      const int32_t next = sample_token(logits + int64_t(r) * c.vocab_size, c.vocab_size,
                                        o.temperature, o.top_k, u);
      s.out.push_back(next);
      if (on_token) on_token(next);
      s.done = next == o.stop_token || int64_t(s.prompt->size() + s.out.size()) >= s.total;
    }
  }
  std::vector<std::vector<int32_t>> out;
  for (Sequence& s : seqs) out.push_back(std::move(s.out));
  return out;
}

std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  return std::move(generate_batch(model, {prompt}, o, on_token).front());
}

}  // namespace cleave
