// Sampling text from a model through a paged key/value cache: temperature (0 = greedy) and top-k
// (0 = the whole vocabulary). Every prompt is prefilled in one pass (or in chunks of a set size),
// then decoded one token a step; the sequences of a step go through one forward as a ragged
// batch (Transformer::forward_cached). The draw of a sequence's token i uses Philox keyed by
// (its seed, i): the same seed gives the same text, alone or among other sequences.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "cleave/model/transformer.h"

namespace cleave {

struct SamplingOptions {
  int max_new_tokens = 100;
  float temperature = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  int stop_token = -1;  // stop after producing this token (e.g. end of text); -1: never
  // Prompt tokens per forward while prefilling (0: the whole prompt in one).
  int64_t prefill_chunk = 0;
  // The key/value pool's size on each rank (0: what the prompts and their new tokens need). One
  // smaller than that is refused before anything runs.
  double kv_cache_mib = 0;
  KvDtype kv_dtype = KvDtype::fp32;  // the pool's keys and values
  // The memory this rank's cache may take at most (0: its host's): the ranks sharing a host
  // share its memory.
  int64_t memory_bytes = 0;
};

// Returns the new tokens; on_token is called with each as it is produced.
std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& options,
                              const std::function<void(int32_t)>& on_token = {});

// Expert parallelism at inference (docs/inference.md): the ep ranks each generate their share of
// the prompts (prompt i on rank i % size), attention data parallel over them, and step together,
// since every forward's MoE layers exchange tokens among them. any(x) is true on every rank when
// x is true on any (size > 1).
struct PromptShare {
  int rank = 0, size = 1;
  std::function<bool(bool)> any;
};

// Several prompts at once, prompt i drawing with seed + i; returns each one's new tokens (empty for
// another rank's share), which are those it gets alone (batch invariance, docs/inference.md).
// on_token is called with every token this rank draws, in the order drawn.
std::vector<std::vector<int32_t>> generate_batch(
    Transformer& model, const std::vector<std::vector<int32_t>>& prompts,
    const SamplingOptions& options, const std::function<void(int32_t)>& on_token = {},
    const PromptShare& share = {});

// The uniform that draws token `index` of a sequence seeded `seed` (Philox): generate's and the
// server's, so that a seed gives the same text in both.
float token_uniform(uint64_t seed, uint64_t index);

// One draw from logits [vocab] with a uniform in (0, 1]: the most likely at temperature 0; else
// among the top_k most likely (0: all), then the fewest most likely whose probabilities sum to
// top_p of theirs (nucleus sampling; 1: all of them). The uniform walks the candidates highest
// first, or, when every token is one, in id order.
int32_t sample_token(const float* logits, int vocab, float temperature, int top_k, float uniform,
                     float top_p = 1.0f);

}  // namespace cleave
