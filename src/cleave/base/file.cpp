#include "cleave/base/file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cleave/base/check.h"

namespace cleave {

namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, const char* what,
                       const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      CLEAVE_FAIL(what << " " << path << ": cannot create temporary file " << tmp << ": "
                       << std::strerror(errno));
    write(out);
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      CLEAVE_FAIL(what << " " << path << ": write failed: " << std::strerror(errno));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ec2;
    fs::remove(tmp, ec2);
    CLEAVE_FAIL(what << " " << path << ": cannot rename " << tmp << " into place: "
                     << ec.message());
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes, const char* what) {
  write_file_atomic(path, what, [bytes](std::ostream& out) {
    out.write(bytes.data(), std::streamsize(bytes.size()));
  });
}

}  // namespace cleave
