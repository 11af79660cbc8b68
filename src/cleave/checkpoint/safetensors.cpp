// Safetensors writer and validating reader. The writer streams the header and tensor bytes through
// one large buffer with POSIX write(), hashing every byte (XXH64) on its way out so the checksum
// costs no second pass over a multi-gigabyte file, and starts the write-back of each chunk at once
// (sync_file_range) so the final fsync has little left to do and dirty pages never pile up. The
// reader maps the file (no heap copy of a multi-gigabyte file), hashes it, then checks the header
// against the file before any tensor is handed out.
#include "cleave/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "cleave/base/check.h"

namespace cleave {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; a big-endian host would need byte swaps");

namespace {

constexpr size_t kChunk = size_t{8} << 20;  // bytes per write()/read() call and per buffer flush

std::string errno_text() { return std::strerror(errno); }

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Number of elements, or false on a negative extent or overflow.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* numel) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *numel = n;
  return true;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct XxhState {
  XXH64_state_t* s = XXH64_createState();
  XxhState() {
    if (s == nullptr) throw std::bad_alloc();
    XXH64_reset(s, 0);
  }
  ~XxhState() { XXH64_freeState(s); }
  XxhState(const XxhState&) = delete;
  XxhState& operator=(const XxhState&) = delete;
};

// Appends bytes to a file through a kChunk buffer; large spans bypass the buffer and go straight
// from the caller's memory to write() in kChunk pieces. Every byte is hashed in file order.
class HashingWriter {
 public:
  explicit HashingWriter(const std::string& path) : path_(path), buf_(new char[kChunk]) {
    fd_.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CLEAVE_CHECK(fd_.fd >= 0, "cannot create " << path << ": " << errno_text());
  }

  void append(const void* data, uint64_t n) {
    const char* p = static_cast<const char*>(data);
    if (n >= kChunk / 2) {  // large: flush what is buffered, then write straight from the source
      flush();
      while (n > 0) {
        size_t k = static_cast<size_t>(std::min<uint64_t>(n, kChunk));
        emit(p, k);
        p += k;
        n -= k;
      }
      return;
    }
    while (n > 0) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, kChunk - used_));
      std::memcpy(buf_.get() + used_, p, k);
      used_ += k;
      p += k;
      n -= k;
      if (used_ == kChunk) flush();
    }
  }

  // Flushes, fsyncs and closes the file; returns the XXH64 of everything written.
  uint64_t finish() {
    flush();
    CLEAVE_CHECK(::fsync(fd_.fd) == 0, "cannot fsync " << path_ << ": " << errno_text());
    int fd = std::exchange(fd_.fd, -1);
    CLEAVE_CHECK(::close(fd) == 0, "cannot close " << path_ << ": " << errno_text());
    return XXH64_digest(hash_.s);
  }

  uint64_t written() const { return written_ + used_; }

 private:
  void flush() {
    if (used_ == 0) return;
    emit(buf_.get(), used_);
    used_ = 0;
  }

  void emit(const char* p, size_t n) {
    XXH64_update(hash_.s, p, n);
    written_ += n;
    while (n > 0) {
      ssize_t w = ::write(fd_.fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      CLEAVE_CHECK(w > 0,
                   "cannot write " << path_ << ": " << (w < 0 ? errno_text() : "no progress"));
      p += w;
      n -= static_cast<size_t>(w);
    }
    // Start writing back the whole pages written so far; a hint, so errors are ignored (fsync
    // reports real ones). Leaves the last partial page alone: it is about to be written again.
    uint64_t upto = written_ & ~uint64_t{4095};
    if (upto > synced_) {
      ::sync_file_range(fd_.fd, static_cast<off_t>(synced_), static_cast<off_t>(upto - synced_),
                        SYNC_FILE_RANGE_WRITE);
      synced_ = upto;
    }
  }

  std::string path_;
  Fd fd_;
  std::unique_ptr<char[]> buf_;
  size_t used_ = 0;
  uint64_t written_ = 0;
  uint64_t synced_ = 0;  // bytes handed to write-back
  XxhState hash_;
};

}  // namespace

uint64_t safetensors_dtype_size(const std::string& dtype) {
  static const std::pair<const char*, uint64_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  for (const auto& [name, size] : kSizes) {
    if (dtype == name) return size;
  }
  return 0;
}

std::string write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Header: tensors in the order given, laid out back to back, so data_offsets are contiguous
  // from 0 to the end of the file (what the reference reader requires).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    CLEAVE_CHECK(t.name != "__metadata__", "writing " << path << ": \"__metadata__\" is reserved");
    CLEAVE_CHECK(seen.insert(t.name).second,
                 "writing " << path << ": tensor '" << t.name << "' given twice");
    uint64_t esize = safetensors_dtype_size(t.dtype);
    CLEAVE_CHECK(esize != 0, "writing " << path << ": tensor '" << t.name << "' has unknown dtype '"
                                        << t.dtype << "'");
    uint64_t numel = 0, nbytes = 0;
    CLEAVE_CHECK(checked_numel(t.shape, &numel) && !__builtin_mul_overflow(numel, esize, &nbytes),
                 "writing " << path << ": tensor '" << t.name << "' has invalid shape "
                            << shape_text(t.shape));
    CLEAVE_CHECK(nbytes == t.nbytes, "writing " << path << ": tensor '" << t.name << "' of dtype "
                                                << t.dtype << " and shape " << shape_text(t.shape)
                                                << " needs " << nbytes << " bytes, given "
                                                << t.nbytes);
    CLEAVE_CHECK(t.data != nullptr || t.nbytes == 0,
                 "writing " << path << ": tensor '" << t.name << "' has no data");
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = t.dtype;
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + nbytes};
    header[t.name] = std::move(e);
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    CLEAVE_FAIL("writing " << path << ": cannot encode the header: " << e.what());
  }
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  HashingWriter w(path);
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  w.append(len, 8);
  w.append(text.data(), text.size());
  for (const TensorView& t : tensors) w.append(t.data, t.nbytes);
  CLEAVE_CHECK(w.written() == 8 + text.size() + offset, "writing " << path << ": size mismatch");
  return hex16(w.finish());
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) { load(nullptr); }

SafetensorsFile::SafetensorsFile(const std::string& path, const std::string& expected_checksum)
    : path_(path) {
  load(&expected_checksum);
}

void SafetensorsFile::load(const std::string* expected_checksum) {
  const std::string& path = path_;
  {
    Fd fd;
    fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    CLEAVE_CHECK(fd.fd >= 0, "cannot open safetensors file " << path << ": " << errno_text());
    struct stat st {};
    CLEAVE_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat " << path << ": " << errno_text());
    CLEAVE_CHECK(S_ISREG(st.st_mode), path << " is not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.fd, 0);
      CLEAVE_CHECK(p != MAP_FAILED, "cannot map " << path << ": " << errno_text());
      const uint64_t len = size_;
      bytes_ = std::shared_ptr<const char>(static_cast<const char*>(p), [len](const char* q) {
        ::munmap(const_cast<char*>(q), len);
      });
      ::madvise(p, size_, MADV_SEQUENTIAL);  // read-ahead for the hash pass
    }
  }
  const char* bytes = bytes_.get();
  checksum_ = hex16(XXH64(bytes, size_, 0));
  if (size_ > 0) ::madvise(const_cast<char*>(bytes), size_, MADV_NORMAL);  // tensors: any order
  if (expected_checksum != nullptr) {
    CLEAVE_CHECK(checksum_ == *expected_checksum, "checksum mismatch in "
                                                      << path << ": expected " << *expected_checksum
                                                      << ", found " << checksum_
                                                      << "; the checkpoint is corrupted");
  }

  const uint64_t size = size_;
  CLEAVE_CHECK(size >= 8, "invalid safetensors file " << path << ": " << size
                                                      << " bytes, shorter than the 8-byte header "
                                                         "length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  CLEAVE_CHECK(hlen <= size - 8, "invalid safetensors file " << path << ": header length " << hlen
                                                             << " exceeds the file size " << size
                                                             << " (truncated or not safetensors)");
  data_start_ = 8 + hlen;
  const uint64_t data_size = size - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL("invalid safetensors file " << path << ": header is not JSON: " << e.what());
  }
  CLEAVE_CHECK(header.is_object(),
               "invalid safetensors file " << path << ": header is not a JSON object");

  std::vector<std::tuple<uint64_t, uint64_t, std::string>> ranges;  // data bytes, tensor
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      CLEAVE_CHECK(v.is_object(),
                   "invalid safetensors file " << path << ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        CLEAVE_CHECK(m.value().is_string(), "invalid safetensors file "
                                                << path << ": __metadata__ value '" << m.key()
                                                << "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "invalid safetensors file " + path + ": tensor '" + name + "'";
    CLEAVE_CHECK(v.is_object(), where << " is not an object");
    CLEAVE_CHECK(v.contains("dtype") && v["dtype"].is_string(), where << " has no string dtype");
    CLEAVE_CHECK(v.contains("shape") && v["shape"].is_array(), where << " has no shape array");
    CLEAVE_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() &&
                     v["data_offsets"].size() == 2 && v["data_offsets"][0].is_number_unsigned() &&
                     v["data_offsets"][1].is_number_unsigned(),
                 where << " has no data_offsets [begin, end]");
    TensorInfo info;
    info.dtype = v["dtype"].get<std::string>();
    for (const auto& d : v["shape"]) {
      CLEAVE_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= uint64_t{INT64_MAX},
                   where << " has an invalid shape " << v["shape"].dump());
      info.shape.push_back(d.get<int64_t>());
    }
    info.begin = v["data_offsets"][0].get<uint64_t>();
    info.end = v["data_offsets"][1].get<uint64_t>();
    uint64_t esize = safetensors_dtype_size(info.dtype);
    CLEAVE_CHECK(esize != 0, where << " has unknown dtype '" << info.dtype << "'");
    CLEAVE_CHECK(info.begin <= info.end && info.end <= data_size,
                 where << " has data_offsets [" << info.begin << ", " << info.end
                       << "] outside the data section of " << data_size
                       << " bytes (truncated file?)");
    uint64_t numel = 0, nbytes = 0;
    CLEAVE_CHECK(
        checked_numel(info.shape, &numel) && !__builtin_mul_overflow(numel, esize, &nbytes),
        where << " has an invalid shape " << shape_text(info.shape));
    CLEAVE_CHECK(info.end - info.begin == nbytes,
                 where << " of dtype " << info.dtype << " and shape " << shape_text(info.shape)
                       << " needs " << nbytes << " bytes, data_offsets give "
                       << info.end - info.begin);
    ranges.emplace_back(info.begin, info.end, name);
    tensors_.emplace(name, std::move(info));
  }
  // The tensors must tile the data section: no overlap, no gap, no trailing bytes.
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  std::string previous = "the start of the data section";
  for (const auto& [b, e, name] : ranges) {
    CLEAVE_CHECK(b == pos, "invalid safetensors file "
                               << path << ": tensor '" << name << "' at bytes [" << b << ", " << e
                               << ") of the data section "
                               << (b < pos ? "overlaps " : "leaves a gap after ") << previous
                               << ", which ends at byte " << pos);
    pos = e;
    previous = "tensor '" + name + "'";
  }
  CLEAVE_CHECK(pos == data_size, "invalid safetensors file " << path << ": " << data_size - pos
                                                             << " bytes after the last tensor");
}

const TensorInfo& SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  CLEAVE_CHECK(it != tensors_.end(), "tensor '" << name << "' not found in " << path_);
  return it->second;
}

void SafetensorsFile::read(const std::string& name, const std::string& dtype,
                           const std::vector<int64_t>& shape, void* out) const {
  const TensorInfo& info = find(name);
  CLEAVE_CHECK(info.dtype == dtype, "tensor '" << name << "' in " << path_ << ": expected dtype "
                                               << dtype << ", found " << info.dtype);
  CLEAVE_CHECK(info.shape == shape, "tensor '" << name << "' in " << path_ << ": expected shape "
                                               << shape_text(shape) << ", found "
                                               << shape_text(info.shape));
  if (info.end > info.begin) {
    std::memcpy(out, bytes_.get() + data_start_ + info.begin, info.end - info.begin);
  }
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                               float* out) const {
  read(name, "F32", shape, out);
}

void SafetensorsFile::read_f32_elements(const std::string& name, int64_t numel, int64_t begin,
                                        int64_t count, float* out) const {
  const TensorInfo& info = find(name);
  CLEAVE_CHECK(info.dtype == "F32", "tensor '" << name << "' in " << path_
                                               << ": expected dtype F32, found " << info.dtype);
  CLEAVE_CHECK(int64_t(info.end - info.begin) == numel * 4,
               "tensor '" << name << "' in " << path_ << ": expected " << numel
                          << " elements, found " << (info.end - info.begin) / 4);
  CLEAVE_CHECK(0 <= begin && 0 <= count && begin + count <= numel,
               "tensor '" << name << "' in " << path_ << ": elements [" << begin << ", "
                          << begin + count << ") outside [0, " << numel << ")");
  if (count > 0)
    std::memcpy(out, bytes_.get() + data_start_ + info.begin + uint64_t(begin) * 4,
                size_t(count) * 4);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::string file_checksum(const std::string& path) {
  Fd fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  CLEAVE_CHECK(fd.fd >= 0, "cannot open " << path << ": " << errno_text());
  ::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<char[]> buf(new char[kChunk]);
  XxhState hash;
  for (;;) {
    ssize_t r = ::read(fd.fd, buf.get(), kChunk);
    if (r < 0 && errno == EINTR) continue;
    CLEAVE_CHECK(r >= 0, "cannot read " << path << ": " << errno_text());
    if (r == 0) break;
    XXH64_update(hash.s, buf.get(), static_cast<size_t>(r));
  }
  return hex16(XXH64_digest(hash.s));
}

}  // namespace cleave
