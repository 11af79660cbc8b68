// Files written whole: readers of `path` see the old contents or the new, never half of them.
#pragma once
#include <string>
#include <string_view>

namespace cleave {

// Writes bytes to path through a temporary file beside it and a rename. Throws cleave::Error
// naming `what`, the path and the cause.
void write_file_atomic(const std::string& path, std::string_view bytes, const char* what);

}  // namespace cleave
