#include "cleave/base/released_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace cleave {

void release_range(float* base, int64_t begin, int64_t end) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  char* lo = reinterpret_cast<char*>(base + begin);
  char* hi = reinterpret_cast<char*>(base + end);
  char* page_lo = reinterpret_cast<char*>((uintptr_t(lo) + page - 1) / page * page);
  char* page_hi = reinterpret_cast<char*>(uintptr_t(hi) / page * page);
  if (page_lo >= page_hi) {
    std::memset(lo, 0, size_t(hi - lo));
    return;
  }
  std::memset(lo, 0, size_t(page_lo - lo));
  std::memset(page_hi, 0, size_t(hi - page_hi));
  madvise(page_lo, size_t(page_hi - page_lo), MADV_DONTNEED);
}

}  // namespace cleave
