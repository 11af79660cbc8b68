// Safetensors writer and validating reader. The writer streams the header and tensor bytes through
// one large buffer with POSIX write() and starts the write-back of each chunk at once
// (sync_file_range) so the final fsync has little left to do and dirty pages never pile up; it
// hashes the header and each chunk of every tensor as it goes. The reader reads the header on
// opening and a tensor's bytes with pread only when asked for them, verifying each chunk it reads,
// so a rank that keeps a slice of a checkpoint reads (and checks) that slice and no more.
#include "cleave/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
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
// from the caller's memory to write() in kChunk pieces.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path) : path_(path), buf_(new char[kChunk]) {
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

  // Flushes, fsyncs and closes the file.
  void finish() {
    flush();
    CLEAVE_CHECK(::fsync(fd_.fd) == 0, "cannot fsync " << path_ << ": " << errno_text());
    int fd = std::exchange(fd_.fd, -1);
    CLEAVE_CHECK(::close(fd) == 0, "cannot close " << path_ << ": " << errno_text());
  }

  uint64_t written() const { return written_ + used_; }

 private:
  void flush() {
    if (used_ == 0) return;
    emit(buf_.get(), used_);
    used_ = 0;
  }

  void emit(const char* p, size_t n) {
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
};

// The checksums of each chunk of n bytes at p.
std::vector<std::string> chunk_checksums(const char* p, uint64_t n, uint64_t chunk_bytes) {
  std::vector<std::string> out;
  for (uint64_t at = 0; at < n; at += chunk_bytes)
    out.push_back(hex16(XXH64(p + at, size_t(std::min(chunk_bytes, n - at)), 0)));
  return out;
}

// Header lengths beyond this are refused before anything is allocated: 10,000 tensors take
// about 1 MB of header.
constexpr uint64_t kMaxHeaderBytes = uint64_t{256} << 20;

}  // namespace

nlohmann::json FileChecksums::to_json() const {
  return {{"bytes", bytes}, {"header_xxh64", header}, {"chunk_bytes", chunk_bytes},
          {"chunks_xxh64", chunks}};
}

FileChecksums FileChecksums::from_json(const nlohmann::json& j, const std::string& where) {
  FileChecksums out;
  // A count: an integer of at least 0 (nlohmann's get<uint64_t> would convert a float or a
  // negative number, 1e116 without a defined result).
  auto count = [&](const char* key) {
    const nlohmann::json& v = j.at(key);
    CLEAVE_CHECK(v.is_number_unsigned(),
                 where << ": " << key << " is " << v.dump() << ", not a whole number of bytes");
    return v.get<uint64_t>();
  };
  try {
    out.bytes = count("bytes");
    out.header = j.at("header_xxh64").get<std::string>();
    out.chunk_bytes = count("chunk_bytes");
    out.chunks = j.at("chunks_xxh64").get<std::map<std::string, std::vector<std::string>>>();
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL(where << ": needs bytes, header_xxh64, chunk_bytes and chunks_xxh64 {tensor: "
                         "[checksums]}: "
                      << e.what());
  }
  CLEAVE_CHECK(out.chunk_bytes >= 4096 && out.chunk_bytes <= (uint64_t{1} << 30),
               where << ": chunk_bytes " << out.chunk_bytes << " is outside [4096, 2^30]");
  return out;
}

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

FileChecksums write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                uint64_t chunk_bytes) {
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

  FileChecksums sums;
  sums.chunk_bytes = chunk_bytes;
  CLEAVE_CHECK(chunk_bytes > 0, "writing " << path << ": chunk_bytes must be positive");
  FileWriter w(path);
  std::string head(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) head[size_t(i)] = static_cast<char>(n >> (8 * i));
  head += text;
  sums.header = hex16(XXH64(head.data(), head.size(), 0));
  w.append(head.data(), head.size());
  for (const TensorView& t : tensors) {
    sums.chunks[t.name] = chunk_checksums(static_cast<const char*>(t.data), t.nbytes, chunk_bytes);
    w.append(t.data, t.nbytes);
  }
  sums.bytes = w.written();
  CLEAVE_CHECK(sums.bytes == head.size() + offset, "writing " << path << ": size mismatch");
  w.finish();
  return sums;
}

struct SafetensorsFile::Open {
  int fd = -1;
  uint64_t size = 0;
  std::optional<FileChecksums> expected;
  uint64_t bytes_read = 0;
  // The chunks read last, each verified as it was read: reading a box row by row takes a few
  // rows from every chunk.
  struct Cached {
    std::string tensor;
    uint64_t chunk = 0, last_use = 0;
    std::vector<char> bytes;
  };
  std::vector<Cached> cache;
  uint64_t clock = 0;

  ~Open() {
    if (fd >= 0) ::close(fd);
  }

  void pread_exact(const std::string& path, uint64_t offset, uint64_t n, char* out) {
    bytes_read += n;
    while (n > 0) {
      ssize_t r = ::pread(fd, out, size_t(std::min<uint64_t>(n, kChunk)), off_t(offset));
      if (r < 0 && errno == EINTR) continue;
      CLEAVE_CHECK(r > 0, "cannot read " << path << " at byte " << offset << ": "
                                         << (r < 0 ? errno_text() : "the file ended early"));
      out += r;
      offset += uint64_t(r);
      n -= uint64_t(r);
    }
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) { load_header(); }

SafetensorsFile::SafetensorsFile(const std::string& path, const FileChecksums& expected)
    : path_(path) {
  open_ = std::make_shared<Open>();
  open_->expected = expected;
  load_header();
}

SafetensorsFile::SafetensorsFile(const std::string& path, const std::string& expected_file_checksum)
    : path_(path) {
  const std::string found = file_checksum(path);
  CLEAVE_CHECK(found == expected_file_checksum,
               "checksum mismatch in " << path << ": expected " << expected_file_checksum
                                       << ", found " << found << "; the checkpoint is corrupted");
  load_header();
  open_->bytes_read += open_->size;  // the checksum read all of it
}

void SafetensorsFile::load_header() {
  const std::string& path = path_;
  if (!open_) open_ = std::make_shared<Open>();
  Open& o = *open_;
  // O_NONBLOCK: opening a FIFO must not wait for a writer before it is refused as no file.
  o.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  CLEAVE_CHECK(o.fd >= 0, "cannot open safetensors file " << path << ": " << errno_text());
  struct stat st {};
  CLEAVE_CHECK(::fstat(o.fd, &st) == 0, "cannot stat " << path << ": " << errno_text());
  CLEAVE_CHECK(S_ISREG(st.st_mode), path << " is not a regular file");
  o.size = static_cast<uint64_t>(st.st_size);
  const uint64_t size = o.size;
  if (o.expected)
    CLEAVE_CHECK(size == o.expected->bytes,
                 path << " is " << size << " bytes where the checkpoint recorded "
                      << o.expected->bytes << ": cut off mid-write or replaced");
  CLEAVE_CHECK(size >= 8, "invalid safetensors file " << path << ": " << size
                                                      << " bytes, shorter than the 8-byte header "
                                                         "length");
  char len[8];
  o.pread_exact(path, 0, 8, len);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t{static_cast<unsigned char>(len[i])} << (8 * i);
  CLEAVE_CHECK(hlen <= size - 8, "invalid safetensors file " << path << ": header length " << hlen
                                                             << " exceeds the file size " << size
                                                             << " (truncated or not safetensors)");
  CLEAVE_CHECK(hlen <= kMaxHeaderBytes, "invalid safetensors file "
                                            << path << ": header length " << hlen
                                            << " exceeds the limit of " << kMaxHeaderBytes);
  std::string head(len, 8);
  head.resize(8 + hlen);
  o.pread_exact(path, 8, hlen, head.data() + 8);
  if (o.expected) {
    const std::string found = hex16(XXH64(head.data(), head.size(), 0));
    CLEAVE_CHECK(found == o.expected->header,
                 "checksum mismatch in " << path << ": its header: expected " << o.expected->header
                                         << ", found " << found << "; the checkpoint is corrupted");
  }
  data_start_ = 8 + hlen;
  const uint64_t data_size = size - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(head.begin() + 8, head.end());
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
  if (o.expected) {  // a checksum for every chunk of every tensor, and none for anything else
    for (const auto& [name, info] : tensors_) {
      const auto it = o.expected->chunks.find(name);
      const uint64_t want = (info.end - info.begin + o.expected->chunk_bytes - 1) /
                            o.expected->chunk_bytes;
      CLEAVE_CHECK(it != o.expected->chunks.end() && it->second.size() == want,
                   path << ": the checkpoint records "
                        << (it == o.expected->chunks.end() ? 0 : it->second.size())
                        << " chunk checksums for tensor '" << name << "', which has " << want);
    }
    for (const auto& [name, sums] : o.expected->chunks)
      CLEAVE_CHECK(tensors_.count(name), path << ": the checkpoint records checksums for tensor '"
                                              << name << "', which the file does not hold");
  }
}

const TensorInfo& SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  CLEAVE_CHECK(it != tensors_.end(), "tensor '" << name << "' not found in " << path_);
  return it->second;
}

void SafetensorsFile::read_bytes(const std::string& name, const TensorInfo& info, uint64_t begin,
                                 uint64_t n, char* out) const {
  Open& o = *open_;
  const uint64_t base = data_start_ + info.begin, total = info.end - info.begin;
  if (!o.expected) {
    if (n > 0) o.pread_exact(path_, base + begin, n, out);
    return;
  }
  const uint64_t C = o.expected->chunk_bytes;
  const std::vector<std::string>& sums = o.expected->chunks.at(name);
  auto verify = [&](uint64_t k, const char* bytes, uint64_t len) {
    const std::string found = hex16(XXH64(bytes, size_t(len), 0));
    CLEAVE_CHECK(found == sums[k], "checksum mismatch in "
                                       << path_ << ": tensor '" << name << "' bytes ["
                                       << k * C << ", " << k * C + len << "): expected " << sums[k]
                                       << ", found " << found << "; the checkpoint is corrupted");
  };
  for (uint64_t at = begin; at < begin + n;) {
    const uint64_t k = at / C, c0 = k * C, len = std::min(C, total - c0);
    const uint64_t upto = std::min(begin + n, c0 + len);
    char* dst = out + (at - begin);
    if (at == c0 && upto == c0 + len) {  // the whole chunk: straight into place
      o.pread_exact(path_, base + c0, len, dst);
      verify(k, dst, len);
    } else {
      Open::Cached* hit = nullptr;
      for (Open::Cached& c : o.cache)
        if (c.chunk == k && c.tensor == name) hit = &c;
      if (hit == nullptr) {
        if (o.cache.size() < 4) {
          hit = &o.cache.emplace_back();
        } else {
          hit = &*std::min_element(o.cache.begin(), o.cache.end(),
                                   [](auto& a, auto& b) { return a.last_use < b.last_use; });
        }
        hit->tensor = name;
        hit->chunk = k;
        hit->bytes.resize(len);
        o.pread_exact(path_, base + c0, len, hit->bytes.data());
        verify(k, hit->bytes.data(), len);
      }
      hit->last_use = ++o.clock;
      std::memcpy(dst, hit->bytes.data() + (at - c0), upto - at);
    }
    at = upto;
  }
}

void SafetensorsFile::read(const std::string& name, const std::string& dtype,
                           const std::vector<int64_t>& shape, void* out) const {
  const TensorInfo& info = find(name);
  CLEAVE_CHECK(info.dtype == dtype, "tensor '" << name << "' in " << path_ << ": expected dtype "
                                               << dtype << ", found " << info.dtype);
  CLEAVE_CHECK(info.shape == shape, "tensor '" << name << "' in " << path_ << ": expected shape "
                                               << shape_text(shape) << ", found "
                                               << shape_text(info.shape));
  read_bytes(name, info, 0, info.end - info.begin, static_cast<char*>(out));
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
  read_bytes(name, info, uint64_t(begin) * 4, uint64_t(count) * 4, reinterpret_cast<char*>(out));
}

void SafetensorsFile::verify_all() const {
  if (!open_->expected) return;
  std::vector<char> buf;
  for (const auto& [name, info] : tensors_) {
    const uint64_t C = open_->expected->chunk_bytes, total = info.end - info.begin;
    for (uint64_t at = 0; at < total; at += C) {
      buf.resize(size_t(std::min(C, total - at)));
      read_bytes(name, info, at, buf.size(), buf.data());
    }
  }
}

FileChecksums SafetensorsFile::compute_checksums(uint64_t chunk_bytes) const {
  CLEAVE_CHECK(chunk_bytes > 0, "chunk_bytes must be positive");
  FileChecksums out;
  out.bytes = open_->size;
  out.chunk_bytes = chunk_bytes;
  std::vector<char> buf(size_t(std::min<uint64_t>(data_start_, kChunk)));
  XxhState head;
  for (uint64_t at = 0; at < data_start_; at += buf.size()) {
    const uint64_t len = std::min<uint64_t>(buf.size(), data_start_ - at);
    open_->pread_exact(path_, at, len, buf.data());
    XXH64_update(head.s, buf.data(), size_t(len));
  }
  out.header = hex16(XXH64_digest(head.s));
  for (const auto& [name, info] : tensors_) {
    std::vector<std::string>& sums = out.chunks[name];
    const uint64_t total = info.end - info.begin;
    for (uint64_t at = 0; at < total; at += chunk_bytes) {
      buf.resize(size_t(std::min(chunk_bytes, total - at)));
      open_->pread_exact(path_, data_start_ + info.begin + at, buf.size(), buf.data());
      sums.push_back(hex16(XXH64(buf.data(), buf.size(), 0)));
    }
  }
  return out;
}

uint64_t SafetensorsFile::bytes_read() const { return open_->bytes_read; }

uint64_t SafetensorsFile::size() const { return open_->size; }

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
