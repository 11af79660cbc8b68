// A 64-byte aligned, zero-initialised array: the flat buffers that hold parameters, gradients,
// optimizer state and activations. Allocated once, reused every step (no page faults per step but
// where ZeRO-2/3 return pages). Large buffers come straight from mmap: their pages are zero and take
// no memory until written, so a ZeRO-3 rank never holds the whole model's parameters or gradients
// at once.
#pragma once
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cleave/base/check.h"

namespace cleave {

// The bytes a work buffer of `count` elements of `size` bytes takes: whole 64-byte lines, as
// Buffer and the products' per-thread buffers reserve them (and the planner counts them).
inline int64_t aligned_bytes(int64_t count, size_t size) {
  return (count * int64_t(size) + 63) / 64 * 64;
}

// Buffers of this size and more are mapped with transparent huge pages (Buffer::resize).
inline constexpr size_t kHugePageBufferBytes = size_t(64) << 20;

// The bytes the Buffers this thread allocated own (less those it released), touched or not: the
// planner sizes a set of work buffers by reserving it on a model that never runs
// (Transformer::backward_scratch_bytes), so the figure is the code's own, not a second formula.
// Per thread, so that the search's threads reserving at once do not count each other's.
inline thread_local int64_t buffer_bytes_owned = 0;

template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t n) { resize(n); }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
        mapped_bytes_(std::exchange(o.mapped_bytes_, 0)),
        owned_bytes_(std::exchange(o.owned_bytes_, 0)), borrowed_(std::exchange(o.borrowed_, false)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(mapped_bytes_, o.mapped_bytes_);
    std::swap(owned_bytes_, o.owned_bytes_);
    std::swap(borrowed_, o.borrowed_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // untouched: address space only, for a buffer that is never read or written (a planned
  // model's parameters, Transformer::planned): mapped without reserving memory, so a model larger
  // than the machine can be planned; where the memory is to be used, the reservation makes too
  // large a request fail here, with this message, rather than at the first touch.
  void resize(int64_t n, bool untouched = false) {
    release();
    size_ = n;
    const size_t bytes = size_t(aligned_bytes(n, sizeof(T)));
    owned_bytes_ = bytes;
    buffer_bytes_owned += int64_t(bytes);
    if (bytes >= (size_t(1) << 20) || untouched) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (untouched ? MAP_NORESERVE : 0), -1, 0);
      CLEAVE_CHECK(p != MAP_FAILED, "out of memory mapping " << bytes << " bytes");
      // Transparent huge pages (this kernel gives them only on request): ZeRO-2/3 return released
      // gradients and parameters to the system and fault them in again every step, 512 times
      // fewer faults with 2 MiB pages (measured: ZeRO-2 and ZeRO-3 2x1 about 10% faster). Small
      // buffers keep 4 KiB pages, where a huge page would make a few KiB cost 2 MiB.
      if (bytes >= kHugePageBufferBytes) madvise(p, bytes, MADV_HUGEPAGE);
      data_ = static_cast<T*>(p);
      mapped_bytes_ = bytes;
      return;
    }
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes ? bytes : 64));
    CLEAVE_CHECK(data_ != nullptr, "out of memory allocating " << bytes << " bytes");
    std::memset(static_cast<void*>(data_), 0, bytes);
  }
  // A view of n elements another buffer owns (a slice of a pool), never freed by this one; a
  // resize makes it own memory again. The owner must outlive the view's use.
  void borrow(T* data, int64_t n) {
    release();
    data_ = data;
    size_ = n;
    borrowed_ = true;
  }
  // At least n elements: a smaller buffer is resized (contents not kept), a larger one stays as
  // it is. Work buffers only grow: a resize maps fresh pages that every use would fault in again.
  T* grow(int64_t n) {
    if (size_ < n) resize(n);
    return data_;
  }
  // Exactly n elements, in the memory this buffer owns when that holds them (contents kept only
  // then): a buffer whose size follows a server's ragged batches from step to step is not unmapped
  // and faulted in again at every change; at a fixed shape (training) it is resize, once.
  T* fit(int64_t n) {
    if (!borrowed_ && data_ && size_t(n) * sizeof(T) <= owned_bytes_) size_ = n;
    else resize(n);
    return data_;
  }
  void zero() { std::memset(static_cast<void*>(data_), 0, size_t(size_) * sizeof(T)); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  void release() {
    if (borrowed_) borrowed_ = false;
    else if (mapped_bytes_) munmap(data_, mapped_bytes_);
    else std::free(data_);
    buffer_bytes_owned -= int64_t(owned_bytes_);
    data_ = nullptr;
    mapped_bytes_ = 0;
    owned_bytes_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
  size_t mapped_bytes_ = 0;  // non-zero: data_ is an mmap of this size
  size_t owned_bytes_ = 0;   // what data_ holds when this buffer owns it
  bool borrowed_ = false;    // data_ belongs to another buffer
};

}  // namespace cleave
