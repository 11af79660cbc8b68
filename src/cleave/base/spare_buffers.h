// Buffers kept for reuse instead of freed: a freed buffer's pages go back to the kernel and a new
// one faults them in again. Activation checkpointing hands a block's saved buffers to the next
// block (llama_long, 8 layers at 2K tokens: 64K page faults, a third of a step, before), and
// ZeRO-3's released units hand their packed weight copies to the next unit's products. Only as
// many exist as are held at once.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "cleave/base/buffer.h"

namespace cleave {

template <class T>
class SpareBuffers {
 public:
  // Into *b (empty, or already of n elements): a spare of n elements, or a new one.
  void fill(Buffer<T>& b, int64_t n) {
    if (b.size() == n) return;
    for (Buffer<T>& s : spares_)
      if (s.size() == n) {
        std::swap(b, s);
        spares_.erase(spares_.begin() + (&s - spares_.data()));
        return;
      }
    b.resize(n);
  }
  // Into *b: a spare of n elements if there is one; else *b stays as it is.
  void reuse(Buffer<T>& b, int64_t n) {
    if (b.size() == 0 && has(n)) fill(b, n);
  }
  void give(Buffer<T>& b) {
    if (b.size() > 0) spares_.push_back(std::exchange(b, Buffer<T>()));
  }

 private:
  bool has(int64_t n) const {
    for (const Buffer<T>& s : spares_)
      if (s.size() == n) return true;
    return false;
  }
  std::vector<Buffer<T>> spares_;
};

}  // namespace cleave
