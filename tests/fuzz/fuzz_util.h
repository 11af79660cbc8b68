// What every fuzz target shares: a scratch folder for readers that take a path, and the rule a
// reader must keep on hostile input.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "cleave/base/check.h"

namespace cleave::fuzz {

// A folder of this process's own under $TMPDIR, removed at exit (a crash leaves it behind; the
// smoke run's TMPDIR is a folder it removes itself).
inline const std::string& scratch() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cleave-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("cleave fuzz: mkdtemp");
      std::abort();
    }
    static const std::string removed_at_exit = tmpl;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(removed_at_exit, ec);
    });
    return tmpl;
  }();
  return dir;
}

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cleave fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "cleave fuzz: %s\n", what.c_str());
  std::abort();  // libFuzzer keeps the input as crash-<sha1>
}

// A reader either accepts the input or refuses it with a cleave::Error whose message names
// `must_name` (the file at fault; "" for none). Any other exception escaping it (a JSON or TOML
// library's own, std::out_of_range, ...) or a message that does not say which file is a finding,
// as are the crashes, hangs, leaks and sanitizer reports libFuzzer catches itself. Returns whether
// the reader accepted the input.
template <class Read>
bool accepted(Read&& read, const std::string& must_name) {
  try {
    read();
    return true;
  } catch (const Error& e) {
    const std::string message = e.what();
    if (!must_name.empty() && message.find(must_name) == std::string::npos)
      finding("a refusal that does not name " + must_name + ": " + message);
    return false;
  } catch (const std::exception& e) {
    finding(std::string("not a cleave::Error but ") + typeid(e).name() + ": " + e.what());
  }
}

// A folder and a FIFO in the scratch folder, and /dev/zero: files a path-taking reader must refuse
// by name before it reads (read as empty, blocking forever, never ending).
inline const std::vector<std::string>& special_files() {
  static const std::vector<std::string> paths = [] {
    const std::string dir = scratch() + "/a_folder", fifo = scratch() + "/a_fifo";
    if (::mkdir(dir.c_str(), 0755) != 0 || ::mkfifo(fifo.c_str(), 0644) != 0)
      finding("cannot create " + dir + " and " + fifo);
    return std::vector<std::string>{dir, fifo, "/dev/zero"};
  }();
  return paths;
}

// In a folder a reader takes files from by name: dir.safetensors (a folder), fifo.safetensors (a
// FIFO) and zero.safetensors (a link to /dev/zero), which it must refuse without hanging.
inline void special_safetensors(const std::string& dir) {
  if (::mkdir((dir + "/dir.safetensors").c_str(), 0755) != 0 ||
      ::mkfifo((dir + "/fifo.safetensors").c_str(), 0644) != 0 ||
      ::symlink("/dev/zero", (dir + "/zero.safetensors").c_str()) != 0)
    finding("cannot lay out " + dir);
}

// Once per process: `read(path)` refuses each of `paths` (a hang is a finding through libFuzzer's
// -timeout).
template <class Read>
void refuses_once(const std::vector<std::string>& paths, Read&& read) {
  static bool done = false;
  if (done) return;
  done = true;
  for (const std::string& p : paths)
    if (accepted([&] { read(p); }, p)) finding(p + " accepted as a file");
}

}  // namespace cleave::fuzz
