// score_tokens CHECKPOINT "ID ID ...": the trainer's forward (Transformer::forward, fp32) over the
// tokens, one line per token after the first: log p(token | those before it), which is minus the
// trainer's loss for that target, printed with enough digits to read back the same float. The
// server's log-probabilities are checked against these (serve_test.sh).
#include <cstdio>
#include <exception>
#include <sstream>
#include <vector>

#include "cleave/checkpoint/load_model.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: score_tokens CHECKPOINT \"ID ID ...\"\n");
    return 2;
  }
  try {
    cleave::LoadedModel loaded = cleave::load_model(argv[1], cleave::Precision::fp32);
    std::vector<int32_t> tokens;
    std::istringstream in(argv[2]);
    for (int32_t id; in >> id;) tokens.push_back(id);
    const int64_t T = int64_t(tokens.size());
    if (T < 2) throw std::runtime_error("score_tokens: give at least two token ids");
    std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
    targets.push_back(0);
    loaded.model->forward(tokens.data(), targets.data(), 1, T, 0.0f);
    for (int64_t t = 0; t + 1 < T; ++t) std::printf("%.9g\n", double(-loaded.model->losses()[t]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "score_tokens: %s\n", e.what());
    return 1;
  }
  return 0;
}
