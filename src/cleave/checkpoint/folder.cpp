// Checkpoint folders: written complete under "<dir>.tmp-<pid>", made durable (fsync of every file
// and of the folder), then swapped into place by rename, so "<dir>/meta.json" exists only for a
// complete checkpoint. An existing "<dir>" is exchanged atomically with the new folder where the
// file system supports renameat2(RENAME_EXCHANGE) (ext4, xfs, btrfs, tmpfs); elsewhere it is first
// renamed to "<dir>.old-<pid>", leaving a short window in which "<dir>" does not exist and
// latest_checkpoint falls back to the previous step.
#include "cleave/checkpoint/folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "cleave/base/check.h"
#include "cleave/base/file.h"

namespace cleave {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "cleave-checkpoint";
// 2: a tensor may be split in pieces over several files; 3: a piece is a box of the global tensor;
// 4: each file's checksums are its header's and each chunk's of every tensor, not the whole file's
constexpr int kVersion = 4;

std::string errno_text() { return std::strerror(errno); }

// "a/b/" -> "a/b", so that "<dir>.tmp-<pid>" is a sibling of dir, not a child.
std::string strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string parent_of(const std::string& dir) {
  fs::path p = fs::path(dir).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  CLEAVE_CHECK(fd >= 0, "cannot open " << path << " to fsync it: " << errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  CLEAVE_CHECK(rc == 0, "cannot fsync " << path << ": " << errno_text());
}

void write_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CLEAVE_CHECK(fd >= 0, "cannot create " << path << ": " << errno_text());
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      std::string why = w < 0 ? errno_text() : "no progress";
      ::close(fd);
      CLEAVE_FAIL("cannot write " << path << ": " << why);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  bool ok = ::fsync(fd) == 0;
  std::string why = ok ? "" : errno_text();
  ok = (::close(fd) == 0) && ok;
  CLEAVE_CHECK(ok, "cannot fsync/close " << path << ": " << (why.empty() ? errno_text() : why));
}

// Best-effort removal of a folder that is no longer needed; a failure leaves litter, not damage.
void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) std::cerr << "cleave: warning: cannot remove " << path << ": " << ec.message() << "\n";
}

void rename_or_fail(const std::string& from, const std::string& to) {
  CLEAVE_CHECK(::rename(from.c_str(), to.c_str()) == 0,
               "cannot rename " << from << " to " << to << ": " << errno_text());
}

// Puts the complete folder `tmp` at `dir`, replacing any existing `dir`.
void install(const std::string& tmp, const std::string& dir) {
  const std::string parent = parent_of(dir);
  std::error_code ec;
  fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) {
    rename_or_fail(tmp, dir);
    fsync_path(parent, true);
    return;
  }
  CLEAVE_CHECK(fs::is_directory(st),
               "cannot write checkpoint " << dir << ": it exists and is not a folder");
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(parent, true);  // the new checkpoint is durable under its name
    remove_quietly(tmp);       // tmp now holds the previous checkpoint
    fsync_path(parent, true);
    return;
  }
  CLEAVE_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP,
               "cannot exchange " << tmp << " with " << dir << ": " << errno_text());
  // No atomic exchange on this file system: move the old folder aside first.
  const std::string old = dir + ".old-" + std::to_string(::getpid());
  if (fs::exists(fs::symlink_status(old, ec))) remove_quietly(old);
  rename_or_fail(dir, old);
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    std::string why = errno_text();
    ::rename(old.c_str(), dir.c_str());  // put the previous checkpoint back
    CLEAVE_FAIL("cannot rename " << tmp << " to " << dir << ": " << why);
  }
  fsync_path(parent, true);
  remove_quietly(old);
  fsync_path(parent, true);
}

bool is_step_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return false;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

// Compares the step numbers of two step names of any length without overflow.
bool step_less(const std::string& a, const std::string& b) {
  auto digits = [](const std::string& s) {
    size_t i = 5;
    while (i + 1 < s.size() && s[i] == '0') ++i;
    return s.substr(i);
  };
  std::string da = digits(a), db = digits(b);
  if (da.size() != db.size()) return da.size() < db.size();
  if (da != db) return da < db;
  return a < b;  // equal numbers with different zero padding: any fixed order
}

}  // namespace

std::string checkpoint_temp_folder(const std::string& dir, const std::string& tag) {
  return strip_trailing_slashes(dir) + ".tmp-" + tag;
}

void begin_checkpoint_folder(const std::string& dir_in, const std::string& tag) {
  const std::string dir = strip_trailing_slashes(dir_in);
  CLEAVE_CHECK(!dir.empty(), "checkpoint folder: empty name");
  const std::string parent = parent_of(dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  CLEAVE_CHECK(!ec, "cannot create " << parent << ": " << ec.message());
  const std::string tmp = checkpoint_temp_folder(dir, tag);
  if (fs::exists(fs::symlink_status(tmp, ec))) {  // left by an earlier crash of a job
    fs::remove_all(tmp, ec);                      // with our tag
    CLEAVE_CHECK(!ec, "cannot remove stale " << tmp << ": " << ec.message());
  }
  CLEAVE_CHECK(fs::create_directory(tmp, ec) && !ec, "cannot create " << tmp << ": " << ec.message());
}

void finish_checkpoint_folder(const std::string& dir_in, const std::string& tag,
                              const nlohmann::json& meta,
                              const std::map<std::string, std::optional<FileChecksums>>& files) {
  const std::string dir = strip_trailing_slashes(dir_in);
  const std::string tmp = checkpoint_temp_folder(dir, tag);
  CLEAVE_CHECK(meta.is_object() || meta.is_null(),
               "checkpoint " << dir << ": meta must be a JSON object");
  nlohmann::json checksums = nlohmann::json::object();
  for (const auto& [name, known] : files) {
    const std::string path = tmp + "/" + name;
    std::error_code ec;
    CLEAVE_CHECK(fs::is_regular_file(path, ec),
                 "checkpoint file " << path << " is missing: its writer failed, or "
                                    << "the folder is not shared by every host (train.out_dir must be)");
    if (!known) {
      checksums[name] = SafetensorsFile(path).compute_checksums(kChecksumChunkBytes).to_json();
      continue;
    }
    const uint64_t size = fs::file_size(path, ec);
    CLEAVE_CHECK(!ec && size == known->bytes,
                 "checkpoint file " << path << " is " << size << " bytes here, its writer wrote "
                                    << known->bytes
                                    << ": the folder is not shared alike by every host");
    checksums[name] = known->to_json();
  }
  nlohmann::json m = meta.is_null() ? nlohmann::json::object() : meta;
  m["format"] = kFormat;
  m["version"] = kVersion;
  m["files"] = std::move(checksums);
  std::string text;
  try {
    text = m.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL("cannot encode meta.json for " << dir << ": " << e.what());
  }
  write_file_synced(tmp + "/meta.json", text);
  fsync_path(tmp, true);
  install(tmp, dir);
}

void abandon_checkpoint_folder(const std::string& dir, const std::string& tag) {
  std::error_code ignored;
  fs::remove_all(checkpoint_temp_folder(dir, tag), ignored);
}

void write_checkpoint_folder(const std::string& dir, const nlohmann::json& meta,
                             const std::vector<TensorView>& tensors) {
  const std::string tag = std::to_string(::getpid());
  begin_checkpoint_folder(dir, tag);
  try {
    const std::string name = "model-rank00000.safetensors";
    const FileChecksums sums = write_safetensors(checkpoint_temp_folder(dir, tag) + "/" + name,
                                                 tensors, {{"format", kFormat}, {"rank", "0"}});
    finish_checkpoint_folder(dir, tag, meta, {{name, sums}});
  } catch (...) {
    abandon_checkpoint_folder(dir, tag);
    throw;
  }
}

LoadedCheckpoint read_checkpoint_folder(const std::string& dir_in) {
  const std::string dir = strip_trailing_slashes(dir_in);
  std::error_code ec;
  CLEAVE_CHECK(fs::is_directory(dir, ec), "checkpoint folder " << dir << " does not exist");
  const std::string meta_path = dir + "/meta.json";
  CLEAVE_CHECK(fs::is_regular_file(meta_path, ec),
               "checkpoint " << dir << " has no meta.json (" << meta_path
                             << " is missing): incomplete or not a checkpoint");
  LoadedCheckpoint out;
  try {
    const std::string text = read_bounded_file(meta_path, "checkpoint metadata", 1024 * kMiB);
    out.meta_bytes = text.size();
    out.meta = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL("cannot parse " << meta_path << ": " << e.what());
  }
  const nlohmann::json& m = out.meta;
  CLEAVE_CHECK(m.is_object(), meta_path << " is not a JSON object");
  CLEAVE_CHECK(m.contains("format") && m["format"] == kFormat,
               meta_path << ": format is "
                         << (m.contains("format") ? m["format"].dump() : "missing")
                         << ", expected \"" << kFormat << "\"");
  CLEAVE_CHECK(
      m.contains("version") && m["version"].is_number_integer() && m["version"] >= 1 &&
          m["version"] <= kVersion,
      meta_path << ": unsupported checkpoint version "
                << (m.contains("version") ? m["version"].dump() : "(missing)")
                << "; this build reads versions 1 to " << kVersion);
  const bool chunked = m["version"] >= 4;
  CLEAVE_CHECK(m.contains("files") && m["files"].is_object() && !m["files"].empty(),
               meta_path << ": \"files\" must be a non-empty object {file name: "
                         << (chunked ? "checksums}" : "checksum}"));
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string& name = it.key();
    CLEAVE_CHECK(
        !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
        meta_path << ": invalid file name '" << name << "'");
    CLEAVE_CHECK(chunked ? it.value().is_object() : it.value().is_string(),
                 meta_path << ": the checksum" << (chunked ? "s" : "") << " of " << name
                           << (chunked ? " are not an object" : " is not a string"));
    const std::string path = dir + "/" + name;
    CLEAVE_CHECK(fs::is_regular_file(path, ec),
                 "checkpoint file " << path << " listed in " << meta_path
                                    << (!fs::exists(path, ec)    ? " is missing"
                                        : fs::is_directory(path, ec) ? " is a directory"
                                                                     : " is not a regular file (a FIFO, socket or device)"));
  }
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {  // sorted: rank order
    const std::string path = dir + "/" + it.key();
    if (chunked)
      out.files.emplace_back(
          path, FileChecksums::from_json(it.value(), meta_path + ": file " + it.key()));
    else
      out.files.emplace_back(path, it.value().get<std::string>());
  }
  return out;
}

uint64_t LoadedCheckpoint::bytes_read() const {
  uint64_t n = meta_bytes;
  for (const SafetensorsFile& f : files) n += f.bytes_read();
  return n;
}

std::vector<std::string> checkpoints_newest_first(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return {};
  std::vector<std::string> names;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!is_step_name(name)) continue;  // also skips "step_N.tmp-<pid>" and "step_N.old-<pid>"
    std::error_code e2;
    if (!it->is_directory(e2) || !fs::is_regular_file(it->path() / "meta.json", e2)) continue;
    names.push_back(std::move(name));
  }
  CLEAVE_CHECK(!ec, "cannot list " << run_dir << ": " << ec.message());
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return step_less(b, a);
  });
  for (std::string& n : names) n = (fs::path(run_dir) / n).string();
  return names;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const std::vector<std::string> all = checkpoints_newest_first(run_dir);
  return all.empty() ? "" : all.front();
}

}  // namespace cleave
