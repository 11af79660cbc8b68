// Sampling text from a model with a key/value cache: temperature (0 = greedy) and top-k (0 = the
// whole vocabulary). The draw of token i uses Philox keyed by (seed, i): the same seed gives the
// same text.
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
};

// Returns the new tokens; on_token is called with each as it is produced.
std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& options,
                              const std::function<void(int32_t)>& on_token = {});

// One draw from logits [vocab]: exposed for tests.
int32_t sample_token(const float* logits, int vocab, float temperature, int top_k, float uniform);

}  // namespace cleave
