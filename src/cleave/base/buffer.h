// A 64-byte aligned, zero-initialised array: the flat buffers that hold parameters, gradients,
// optimizer state and activations. Allocated once, reused every step (no page faults per step).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cleave/base/check.h"

namespace cleave {

template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t n) { resize(n); }
  ~Buffer() { std::free(data_); }
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void resize(int64_t n) {
    std::free(data_);
    size_ = n;
    const size_t bytes = (size_t(n) * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64));
    CLEAVE_CHECK(data_ != nullptr, "out of memory allocating " << bytes << " bytes");
    std::memset(static_cast<void*>(data_), 0, bytes);
  }
  void zero() { std::memset(static_cast<void*>(data_), 0, size_t(size_) * sizeof(T)); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace cleave
