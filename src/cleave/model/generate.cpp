#include "cleave/model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cleave/base/philox.h"

namespace cleave {

int32_t sample_token(const float* logits, int vocab, float temperature, int top_k, float uniform) {
  if (temperature <= 0.0f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  // Highest logits first, ties by id, so the draw does not depend on the sort's stability.
  auto higher = [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += p[i] = std::exp(double(logits[ids[i]] - logits[ids[0]]) / temperature);
  double target = double(uniform) * sum, acc = 0;
  for (int i = 0; i < k; ++i)
    if ((acc += p[i]) >= target) return ids[i];
  return ids[k - 1];
}

std::vector<int32_t> generate(Transformer& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  CLEAVE_CHECK(!prompt.empty(), "the prompt must hold at least one token");
  const int64_t total = std::min<int64_t>(c.max_seq_len, int64_t(prompt.size()) + o.max_new_tokens);
  CLEAVE_CHECK(int64_t(prompt.size()) < c.max_seq_len,
               "prompt of " << prompt.size() << " tokens leaves no room in max_seq_len " << c.max_seq_len);
  auto cache = model.new_cache(total);
  const float* logits = model.forward_cached(prompt.data(), int64_t(prompt.size()), cache);
  std::vector<int32_t> out;
  const uint64_t stream = hash_name("generate");
  while (int64_t(prompt.size() + out.size()) < total) {
    const float u = philox_uniform(o.seed, stream, out.size());
    const int32_t next = sample_token(logits, c.vocab_size, o.temperature, o.top_k, u);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == o.stop_token || int64_t(prompt.size() + out.size()) >= total) break;
    logits = model.forward_cached(&next, 1, cache);
  }
  return out;
}

}  // namespace cleave
