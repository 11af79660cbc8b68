#include "cleave/base/mapped_floats.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "cleave/base/check.h"

namespace cleave {

namespace {

#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;  // Linux's value; glibc 2.36's headers may lack it
#endif

int64_t page_bytes() {
  static const int64_t bytes = sysconf(_SC_PAGESIZE);
  return bytes;
}

}  // namespace

MappedFloats::MappedFloats(const std::string& dir, int64_t n, const std::string& what) : size_(n) {
  CLEAVE_CHECK(n >= 0, "MappedFloats: n=" << n);
  std::string path = dir + "/cleave-" + what + "-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  fd_ = mkstemp(name.data());
  if (fd_ < 0)
    throw Error("cannot make the offload file for " + what + " in " + dir + ": " +
                std::strerror(errno));
  unlink(name.data());  // nothing to clean up, however the process ends
  const size_t bytes = std::max<size_t>(size_t(n) * sizeof(float), 1);
  // posix_fallocate reserves the blocks now: a full disk fails here, not as SIGBUS mid-step.
  if (const int err = posix_fallocate(fd_, 0, off_t(bytes)); err != 0) {
    close(fd_);
    throw Error("cannot reserve " + std::to_string(bytes) + " bytes for the offloaded " + what +
                " in " + dir + ": " + std::strerror(err));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd_);
    throw Error("cannot map the offload file for " + what + " in " + dir + ": " +
                std::strerror(err));
  }
  data_ = static_cast<float*>(p);
}

MappedFloats::~MappedFloats() {
  if (data_) munmap(data_, std::max<size_t>(size_t(size_) * sizeof(float), 1));
  if (fd_ >= 0) close(fd_);
}

MappedFloats::MappedFloats(MappedFloats&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
      fd_(std::exchange(o.fd_, -1)) {}

MappedFloats& MappedFloats::operator=(MappedFloats&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  std::swap(fd_, o.fd_);
  return *this;
}

void MappedFloats::prefetch(int64_t begin, int64_t end) const {
  const int64_t page = page_bytes();
  const int64_t b = begin * int64_t(sizeof(float)) / page * page;
  const int64_t e = end * int64_t(sizeof(float));
  if (e <= b) return;
  // Mapped writable in one call (Linux 5.14+), rather than a fault per page as the update first
  // touches each; older kernels only read ahead.
  if (madvise(reinterpret_cast<char*>(data_) + b, size_t(e - b), kPopulateWrite) != 0)
    madvise(reinterpret_cast<char*>(data_) + b, size_t(e - b), MADV_WILLNEED);
}

void MappedFloats::drop(int64_t begin, int64_t end) const {
  // Whole pages only: a page shared with a neighbouring span may still be in use.
  const int64_t page = page_bytes();
  const int64_t b = (begin * int64_t(sizeof(float)) + page - 1) / page * page;
  const int64_t e = end * int64_t(sizeof(float)) / page * page;
  if (e <= b) return;
  madvise(reinterpret_cast<char*>(data_) + b, size_t(e - b), MADV_DONTNEED);
}

}  // namespace cleave
