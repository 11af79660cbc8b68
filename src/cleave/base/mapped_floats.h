// An array of floats in a memory-mapped file rather than in the process's memory: optimizer state
// offloaded to disk (ZeRO-Infinity's idea, with the kernel's page cache as the staging buffer).
// The file is made in `dir` and unlinked at once, so nothing is left behind, whatever ends the
// process. A caller streams through it: prefetch the span it will touch next, and drop a span
// it is done with from its resident memory (dirty pages stay in the page cache and are written
// back; the next touch reads them again).
#pragma once
#include <cstdint>
#include <string>

namespace cleave {

class MappedFloats {
 public:
  MappedFloats() = default;
  // n floats, all 0; errors name `what`, the folder and the cause.
  MappedFloats(const std::string& dir, int64_t n, const std::string& what);
  ~MappedFloats();
  MappedFloats(MappedFloats&& o) noexcept;
  MappedFloats& operator=(MappedFloats&& o) noexcept;
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return size_; }
  // Asks the kernel to read [begin, end) in ahead of use (returns at once).
  void prefetch(int64_t begin, int64_t end) const;
  // Takes the whole pages inside [begin, end) out of this process's resident memory (the kernel
  // writes dirty ones back in its own time, and may then reclaim them).
  void drop(int64_t begin, int64_t end) const;

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
  int fd_ = -1;
};

}  // namespace cleave
