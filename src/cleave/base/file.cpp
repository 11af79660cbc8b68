#include "cleave/base/file.h"

#include <sys/stat.h>
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
    // A writer that throws part way (a value it cannot encode) leaves no temporary file behind.
    try {
      write(out);
    } catch (...) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      throw;
    }
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

int64_t check_bounded_file(const std::string& path, const char* what, int64_t max_bytes) {
  // An edge of the program (a user's file): the message names the file, not cleave's source.
  const std::string at = std::string(what) + " " + path;
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) throw Error(at + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error(at + " is a directory, not a file");
  if (!S_ISREG(st.st_mode)) throw Error(at + " is not a regular file (a FIFO, socket or device)");
  if (int64_t(st.st_size) > max_bytes)
    throw Error(at + " is " + std::to_string(st.st_size) + " bytes, more than the " +
                std::to_string(max_bytes) + " a " + what + " may have");
  return int64_t(st.st_size);
}

std::string read_bounded_file(const std::string& path, const char* what, int64_t max_bytes) {
  const int64_t size = check_bounded_file(path, what, max_bytes);
  std::ifstream in(path, std::ios::binary);
  const std::string at = std::string(what) + " " + path;
  if (!in) throw Error(at + ": cannot open: " + std::strerror(errno));
  std::string bytes(size_t(size), '\0');
  in.read(bytes.data(), size);
  if (in.gcount() != size)
    throw Error(at + ": read " + std::to_string(in.gcount()) + " of " + std::to_string(size) +
                " bytes");
  return bytes;
}

int64_t process_bytes_read() {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

}  // namespace cleave
