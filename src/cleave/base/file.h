// Files written whole: readers of `path` see the old contents or the new, never half of them.
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace cleave {

// Writes to path through a temporary file beside it and a rename: `write` streams the contents
// (for files too large to hold twice in memory), or `bytes` are the contents. Throws
// cleave::Error naming `what`, the path and the cause.
void write_file_atomic(const std::string& path, const char* what,
                       const std::function<void(std::ostream&)>& write);
void write_file_atomic(const std::string& path, std::string_view bytes, const char* what);

// The whole contents of `path`, a regular file of at most max_bytes: anything else (missing, a
// directory, a FIFO or device such as /dev/zero, which would never end, or a file larger than
// max_bytes) throws cleave::Error naming `what`, the path and the cause, before reading.
std::string read_bounded_file(const std::string& path, const char* what, int64_t max_bytes);
// The same checks alone, for a reader that opens the file itself (e.g. a library's loader);
// returns the file's size.
int64_t check_bounded_file(const std::string& path, const char* what, int64_t max_bytes);
constexpr int64_t kMiB = int64_t(1) << 20;

// The bytes this process has read with read-like system calls so far, as the kernel counts them
// (/proc/self/io's rchar); -1 where the kernel does not say. A reader's own count is checked
// against it.
int64_t process_bytes_read();

}  // namespace cleave
