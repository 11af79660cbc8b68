// The memory of the host this process runs on, for checks that refuse a request before it
// allocates what the machine cannot hold, and for the planner's cluster files.
#pragma once
#include <unistd.h>

#include <cstdint>

namespace cleave {

// Physical memory in bytes (0 where the system does not say).
inline int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0;
}

}  // namespace cleave
