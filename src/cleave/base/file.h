// Files written whole: readers of `path` see the old contents or the new, never half of them.
#pragma once
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

}  // namespace cleave
