#include "cleave/data/tokens.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>

#include "cleave/base/check.h"
#include "cleave/base/file.h"

namespace cleave {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

constexpr char kMagic[8] = {'C', 'L', 'V', 'T', 'O', 'K', 'S', '\0'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 32;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_width;
  uint64_t token_count;
  uint32_t vocab_size;
  uint32_t reserved;
};
static_assert(sizeof(Header) == kHeaderBytes, "shard header must be 32 bytes");

uint32_t width_for_vocab(uint32_t vocab_size) { return vocab_size <= 65536u ? 2u : 4u; }

}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       uint32_t vocab_size) {
  CLEAVE_CHECK(vocab_size > 0, "token file " << path << ": vocab size must be positive");
  for (size_t i = 0; i < tokens.size(); ++i)
    CLEAVE_CHECK(tokens[i] < vocab_size, "token file " << path << ": token at index " << i
                                                       << " has id " << tokens[i]
                                                       << " >= vocab size " << vocab_size);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.token_width = width_for_vocab(vocab_size);
  h.token_count = tokens.size();
  h.vocab_size = vocab_size;
  h.reserved = 0;

  write_file_atomic(path, "token file", [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    if (h.token_width == 4) {
      out.write(reinterpret_cast<const char*>(tokens.data()),
                std::streamsize(tokens.size() * sizeof(uint32_t)));
      return;
    }
    constexpr size_t kChunk = 1 << 16;  // narrowed a chunk at a time, not copied whole
    std::vector<uint16_t> buf;
    buf.reserve(kChunk);
    for (size_t start = 0; start < tokens.size() && out; start += kChunk) {
      const size_t end = std::min(tokens.size(), start + kChunk);
      buf.assign(tokens.begin() + ptrdiff_t(start), tokens.begin() + ptrdiff_t(end));
      out.write(reinterpret_cast<const char*>(buf.data()),
                std::streamsize(buf.size() * sizeof(uint16_t)));
    }
  });
}

TokenShard::TokenShard(const std::string& path, uint32_t expected_vocab_size) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    CLEAVE_FAIL("token file " << path << ": cannot open: no such file");
  if (fs::is_directory(status)) CLEAVE_FAIL("token file " << path << ": is a directory");
  // A FIFO or device has no size to check against the header, and /dev/zero would never end.
  if (!fs::is_regular_file(status))
    CLEAVE_FAIL("token file " << path << ": is not a regular file (a FIFO, socket or device)");
  const uint64_t file_bytes = fs::file_size(path, ec);
  if (ec) CLEAVE_FAIL("token file " << path << ": cannot read its size: " << ec.message());

  std::ifstream in(path, std::ios::binary);
  if (!in) CLEAVE_FAIL("token file " << path << ": cannot open: " << std::strerror(errno));
  if (file_bytes < kHeaderBytes)
    CLEAVE_FAIL("token file " << path << ": file is shorter than the " << kHeaderBytes
                              << "-byte header (" << file_bytes << " bytes)");
  Header h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h)))
    CLEAVE_FAIL("token file " << path << ": cannot read the header");
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0)
    CLEAVE_FAIL("token file " << path << ": not a cleave token file (bad magic)");
  if (h.version != kVersion)
    CLEAVE_FAIL("token file " << path << ": unsupported version " << h.version << " (expected "
                              << kVersion << ")");
  if (h.token_width != 2 && h.token_width != 4)
    CLEAVE_FAIL("token file " << path << ": bad token width " << h.token_width
                              << " (expected 2 or 4 bytes)");
  if (h.vocab_size == 0) CLEAVE_FAIL("token file " << path << ": vocab size is 0");
  if (h.token_width == 2 && h.vocab_size > 65536u)
    CLEAVE_FAIL("token file " << path << ": bad token width 2 for vocab size " << h.vocab_size
                              << " (ids need 4 bytes)");
  if (h.reserved != 0)
    CLEAVE_FAIL("token file " << path << ": reserved header field is " << h.reserved
                              << " (expected 0)");

  const uint64_t max_count = (std::numeric_limits<uint64_t>::max() - kHeaderBytes) / h.token_width;
  if (h.token_count > max_count)
    CLEAVE_FAIL("token file " << path << ": token count " << h.token_count
                              << " in the header is impossible; truncated or corrupt file ("
                              << file_bytes << " bytes)");
  const uint64_t expected_bytes = kHeaderBytes + h.token_count * h.token_width;
  if (file_bytes != expected_bytes)
    CLEAVE_FAIL("token file " << path << ": size mismatch: expected " << expected_bytes
                              << " bytes (" << kHeaderBytes << "-byte header + " << h.token_count
                              << " tokens x " << h.token_width << " bytes) but the file has "
                              << file_bytes << " bytes ("
                              << (file_bytes < expected_bytes ? "truncated" : "trailing bytes")
                              << ")");
  if (expected_vocab_size != 0 && h.vocab_size != expected_vocab_size)
    CLEAVE_FAIL("token file " << path << ": vocab size mismatch: the file has vocab size "
                              << h.vocab_size << " but " << expected_vocab_size
                              << " was expected");
  if (h.token_count > tokens_.max_size())
    CLEAVE_FAIL("token file " << path << ": too many tokens to hold in memory ("
                              << h.token_count << ")");

  vocab_size_ = h.vocab_size;
  tokens_.resize(h.token_count);
  bool ok = true;
  if (h.token_width == 4) {
    ok = bool(in.read(reinterpret_cast<char*>(tokens_.data()),
                      std::streamsize(h.token_count * sizeof(uint32_t))));
  } else {
    constexpr uint64_t kChunk = 1 << 16;
    std::vector<uint16_t> buf(std::min<uint64_t>(kChunk, h.token_count));
    for (uint64_t start = 0; start < h.token_count && ok; start += kChunk) {
      const uint64_t n = std::min(kChunk, h.token_count - start);
      ok = bool(in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(n * sizeof(uint16_t))));
      for (uint64_t j = 0; j < n && ok; ++j) tokens_[start + j] = buf[j];
    }
  }
  if (!ok) CLEAVE_FAIL("token file " << path << ": read error in the token data");

  for (uint64_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] >= vocab_size_)
      CLEAVE_FAIL("token file " << path << ": token at index " << i << " has id " << tokens_[i]
                                << " >= vocab size " << vocab_size_);
}

}  // namespace cleave
