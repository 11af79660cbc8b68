#include "cleave/data/tokens.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

class TokensTest : public ::testing::Test {
 protected:
  cleave::test_util::TestDir tmp_{"cleave-data-tokens"};
  const fs::path dir_ = tmp_.path();
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& p, const std::string& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
}
template <typename T>
void poke(std::string& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

// Expects constructing the shard to throw cleave::Error whose message has the path and `fault`.
void expect_shard_error(const std::string& p, uint32_t expected_vocab, const std::string& fault) {
  try {
    cleave::TokenShard shard(p, expected_vocab);
    FAIL() << "no error for " << p << " (expected: " << fault << ")";
  } catch (const cleave::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(fault), std::string::npos) << msg;
  }
}

}  // namespace

TEST_F(TokensTest, RoundtripUint16) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 100000; ++i) tokens.push_back((i * 2654435761u) % 65536u);
  const std::string p = path("a.bin");
  cleave::write_token_shard(p, tokens, 65536);
  EXPECT_EQ(fs::file_size(p), 32u + 2u * tokens.size());
  const std::string bytes = read_bytes(p);
  EXPECT_EQ(std::memcmp(bytes.data(), "CLVTOKS\0", 8), 0);
  uint32_t width;
  std::memcpy(&width, bytes.data() + 12, 4);
  EXPECT_EQ(width, 2u);
  cleave::TokenShard shard(p, 65536);
  EXPECT_EQ(shard.size(), tokens.size());
  EXPECT_EQ(shard.vocab_size(), 65536u);
  EXPECT_EQ(shard.tokens(), tokens);
  EXPECT_EQ(shard.path(), p);
  // No temporary files are left behind.
  size_t n_files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) n_files += e.is_regular_file();
  EXPECT_EQ(n_files, 1u);
}

TEST_F(TokensTest, RoundtripUint32) {
  std::vector<uint32_t> tokens = {0, 1, 65535, 65536, 99999, 12345, 70000};
  const std::string p = path("b.bin");
  cleave::write_token_shard(p, tokens, 100000);
  EXPECT_EQ(fs::file_size(p), 32u + 4u * tokens.size());
  cleave::TokenShard shard(p, 0);  // 0: any vocab size
  EXPECT_EQ(shard.vocab_size(), 100000u);
  EXPECT_EQ(shard.tokens(), tokens);
}

TEST_F(TokensTest, EmptyShardRoundtrip) {
  const std::string p = path("empty.bin");
  cleave::write_token_shard(p, {}, 10);
  EXPECT_EQ(fs::file_size(p), 32u);
  cleave::TokenShard shard(p, 10);
  EXPECT_EQ(shard.size(), 0u);
}

TEST_F(TokensTest, OverwriteReplacesFile) {
  const std::string p = path("c.bin");
  cleave::write_token_shard(p, {1, 2, 3, 4, 5}, 10);
  cleave::write_token_shard(p, {7, 8}, 10);
  cleave::TokenShard shard(p, 10);
  EXPECT_EQ(shard.tokens(), (std::vector<uint32_t>{7, 8}));
}

TEST_F(TokensTest, WriteRejectsOutOfRangeToken) {
  const std::string p = path("bad_write.bin");
  try {
    cleave::write_token_shard(p, {1, 2, 10, 3}, 10);
    FAIL() << "no error";
  } catch (const cleave::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 2"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(TokensTest, MissingFile) {
  expect_shard_error(path("nope.bin"), 0, "no such file");
}

TEST_F(TokensTest, DirectoryIsNotAShard) {
  fs::create_directories(path("adir"));
  expect_shard_error(path("adir"), 0, "is a directory");
}

TEST_F(TokensTest, FifoOrDeviceIsNotAShard) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  expect_shard_error(path("fifo"), 0, "is not a regular file (a FIFO, socket or device)");
  expect_shard_error("/dev/zero", 0, "is not a regular file (a FIFO, socket or device)");
}

TEST_F(TokensTest, ShorterThanHeader) {
  const std::string p = path("short.bin");
  write_bytes(p, std::string("CLVTOKS\0\1\0\0\0", 12));
  expect_shard_error(p, 0, "shorter than the 32-byte header");
}

TEST_F(TokensTest, WrongMagic) {
  const std::string p = path("magic.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 10);
  std::string b = read_bytes(p);
  b[0] = 'X';
  write_bytes(p, b);
  expect_shard_error(p, 0, "not a cleave token file");
}

TEST_F(TokensTest, UnsupportedVersion) {
  const std::string p = path("version.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 10);
  std::string b = read_bytes(p);
  poke<uint32_t>(b, 8, 7);
  write_bytes(p, b);
  expect_shard_error(p, 0, "unsupported version 7");
}

TEST_F(TokensTest, BadTokenWidth) {
  const std::string p = path("width.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 10);
  std::string b = read_bytes(p);
  poke<uint32_t>(b, 12, 3);
  write_bytes(p, b);
  expect_shard_error(p, 0, "bad token width 3");
}

TEST_F(TokensTest, WidthTooNarrowForVocab) {
  const std::string p = path("narrow.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 10);
  std::string b = read_bytes(p);
  poke<uint32_t>(b, 24, 70000);
  write_bytes(p, b);
  expect_shard_error(p, 0, "bad token width 2 for vocab size 70000");
}

TEST_F(TokensTest, Truncated) {
  const std::string p = path("trunc.bin");
  cleave::write_token_shard(p, {1, 2, 3, 4, 5}, 10);  // 32 + 10 bytes
  std::string b = read_bytes(p);
  b.resize(b.size() - 3);
  write_bytes(p, b);
  expect_shard_error(p, 0, "expected 42 bytes");
  expect_shard_error(p, 0, "has 39 bytes (truncated)");
}

TEST_F(TokensTest, TrailingBytes) {
  const std::string p = path("trail.bin");
  cleave::write_token_shard(p, {1, 2, 3, 4, 5}, 10);
  std::string b = read_bytes(p);
  b += "xyz";
  write_bytes(p, b);
  expect_shard_error(p, 0, "expected 42 bytes");
  expect_shard_error(p, 0, "has 45 bytes (trailing bytes)");
}

TEST_F(TokensTest, HugeTokenCount) {
  const std::string p = path("huge.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 10);
  std::string b = read_bytes(p);
  poke<uint64_t>(b, 16, ~uint64_t(0));
  write_bytes(p, b);
  expect_shard_error(p, 0, "truncated or corrupt");
}

TEST_F(TokensTest, VocabMismatch) {
  const std::string p = path("vocab.bin");
  cleave::write_token_shard(p, {1, 2, 3}, 1000);
  expect_shard_error(p, 2000, "vocab size mismatch: the file has vocab size 1000 but 2000");
}

TEST_F(TokensTest, TokenOutOfRange) {
  const std::string p = path("range.bin");
  cleave::write_token_shard(p, {1, 2, 3, 4}, 10);
  std::string b = read_bytes(p);
  poke<uint16_t>(b, 32 + 2 * 2, 10);  // token 2 := 10 with vocab 10
  write_bytes(p, b);
  expect_shard_error(p, 0, "token at index 2 has id 10 >= vocab size 10");
}

TEST_F(TokensTest, NonzeroReserved) {
  const std::string p = path("reserved.bin");
  cleave::write_token_shard(p, {1}, 10);
  std::string b = read_bytes(p);
  poke<uint32_t>(b, 28, 5);
  write_bytes(p, b);
  expect_shard_error(p, 0, "reserved header field is 5");
}

