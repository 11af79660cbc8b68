#include "cleave/model/tensor_parallel.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave {

TpShare tp_share(const ModelConfig& c, int tp, int rank) {
  const std::string split = " over parallel.tp = " + std::to_string(tp);
  if (c.n_heads % tp != 0)
    throw Error("model.n_heads = " + std::to_string(c.n_heads) + " cannot be split" + split +
                ": n_heads must be divisible by tp");
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
    throw Error("model.n_kv_heads = " + std::to_string(c.n_kv_heads) + " cannot be split" + split +
                ": n_kv_heads must be divisible by tp (kv heads split) or divide tp (kv heads "
                "replicated)");
  if (c.ffn_hidden % tp != 0)
    throw Error("model.ffn_hidden = " + std::to_string(c.ffn_hidden) + " cannot be split" + split +
                ": ffn_hidden must be divisible by tp");
  TpShare s;
  s.tp = tp;
  s.rank = rank;
  s.heads = c.n_heads / tp;
  s.kv_replicated = c.n_kv_heads % tp != 0;
  s.kv_heads = s.kv_replicated ? 1 : c.n_kv_heads / tp;
  s.first_kv_head = s.kv_replicated ? rank / (tp / c.n_kv_heads) : rank * s.kv_heads;
  s.ffn = c.ffn_hidden / tp;
  s.vocab_rows = (int64_t(c.vocab_size) + tp - 1) / tp;
  s.vocab_begin = rank * s.vocab_rows;
  s.vocab_real = std::clamp<int64_t>(c.vocab_size - s.vocab_begin, 0, s.vocab_rows);
  return s;
}

}  // namespace cleave
