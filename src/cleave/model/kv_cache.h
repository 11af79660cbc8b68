// The key/value cache of one block for generation: the keys and values of every position so far,
// so each new token attends to them without recomputing them.
#pragma once
#include <cstdint>

#include "cleave/base/buffer.h"

namespace cleave {

struct KVCache {
  Buffer<float> k, v;  // [max_pos, n_kv_heads * head_dim] each
  int64_t length = 0;  // positions filled
};

}  // namespace cleave
