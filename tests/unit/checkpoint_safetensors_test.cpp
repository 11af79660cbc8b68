// Safetensors writer/reader: roundtrips, header layout, validation errors, checksums.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/checkpoint/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cleave::SafetensorsFile;
using cleave::TensorView;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  cleave::test_util::TestDir tmp_{"cleave-st"};
  const fs::path dir_ = tmp_.path();
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
};

std::vector<char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A raw safetensors file with the given header text and data bytes (no validation).
void write_raw(const std::string& p, const std::string& header, const std::vector<char>& data) {
  std::vector<char> bytes(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  spit(p, bytes);
}

// Runs f, expects a cleave::Error, and returns its message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cleave::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a cleave::Error";
  return "";
}

bool is_hex16(const std::string& s) {
  if (s.size() != 16) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

TEST_F(SafetensorsTest, RoundtripF32I32Bf16AndMetadata) {
  std::vector<float> w(6), b(3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i) - 1.25f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 1e-3f * static_cast<float>(i + 1);
  std::vector<int32_t> ids = {7, -3, 2147483647, 0};
  std::vector<uint16_t> half = {0x3f80, 0xbf80, 0x0000, 0x7f80, 0x4049};  // BF16 bit patterns
  float scalar = 42.0f;
  std::vector<TensorView> tensors = {
      {"layer.w", "F32", {2, 3}, w.data(), w.size() * 4},
      {"layer.b", "F32", {3}, b.data(), b.size() * 4},
      {"ids", "I32", {4}, ids.data(), ids.size() * 4},
      {"emb.bf16", "BF16", {5}, half.data(), half.size() * 2},
      {"step", "F32", {}, &scalar, 4},
      {"empty", "F32", {0, 4}, nullptr, 0},
  };
  const std::string p = path("a.safetensors");
  const cleave::FileChecksums sums =
      cleave::write_safetensors(p, tensors, {{"step", "12"}, {"note", "hello"}});
  EXPECT_TRUE(is_hex16(sums.header)) << sums.header;
  EXPECT_EQ(sums.to_json(), SafetensorsFile(p).compute_checksums(cleave::kChecksumChunkBytes).to_json());
  EXPECT_EQ(sums.chunks.at("layer.w").size(), 1u);
  EXPECT_EQ(sums.chunks.at("empty").size(), 0u);

  // Header layout: 8-byte length, JSON padded with spaces so data starts 8-aligned.
  std::vector<char> bytes = slurp(p);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  EXPECT_EQ((8 + hlen) % 8, 0u);
  std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(hlen));
  EXPECT_EQ(header.front(), '{');
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["note"], "hello");
  EXPECT_EQ(j["layer.w"]["dtype"], "F32");
  EXPECT_EQ(j["layer.w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["layer.w"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(j["step"]["shape"], nlohmann::json::array());
  EXPECT_EQ(bytes.size(), 8 + hlen + (6 + 3 + 4) * 4 + 5 * 2 + 4);

  SafetensorsFile f(p, sums);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.bytes_read(), 8 + hlen);  // the header only, until a tensor is read
  EXPECT_EQ(f.tensors().size(), 6u);
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.metadata().at("note"), "hello");
  EXPECT_TRUE(f.contains("ids"));
  EXPECT_FALSE(f.contains("__metadata__"));
  EXPECT_EQ(f.tensors().at("emb.bf16").dtype, "BF16");
  EXPECT_EQ(f.tensors().at("layer.w").shape, (std::vector<int64_t>{2, 3}));

  std::vector<float> w2(6), b2(3);
  f.read_f32("layer.w", {2, 3}, w2.data());
  f.read_f32("layer.b", {3}, b2.data());
  EXPECT_EQ(w2, w);
  EXPECT_EQ(b2, b);
  float scalar2 = 0;
  f.read_f32("step", {}, &scalar2);
  EXPECT_EQ(scalar2, 42.0f);
  f.read_f32("empty", {0, 4}, nullptr);
  std::vector<int32_t> ids2(4);
  f.read("ids", "I32", {4}, ids2.data());
  EXPECT_EQ(ids2, ids);
  std::vector<uint16_t> half2(5);
  f.read("emb.bf16", "BF16", {5}, half2.data());
  EXPECT_EQ(half2, half);
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  const std::string p = path("empty.safetensors");
  cleave::write_safetensors(p, {}, {});
  SafetensorsFile f(p);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST_F(SafetensorsTest, LargeTensorsAcrossWriteChunks) {
  // Mix of tensors larger than the write buffer and small ones between them.
  std::vector<float> big(5'000'000), small(7), big2(3'000'001);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 9973) * 0.25f;
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(i);
  for (size_t i = 0; i < big2.size(); ++i) big2[i] = -static_cast<float>(i % 101);
  const std::string p = path("big.safetensors");
  const cleave::FileChecksums sum =
      cleave::write_safetensors(p,
                                {{"small0", "F32", {7}, small.data(), 28},
                                 {"big", "F32", {5'000'000}, big.data(), big.size() * 4},
                                 {"small1", "F32", {7}, small.data(), 28},
                                 {"big2", "F32", {3'000'001}, big2.data(), big2.size() * 4}},
                                {});
  EXPECT_EQ(sum.chunks.at("big").size(), 20u);  // 20,000,000 bytes in chunks of 1 MiB
  SafetensorsFile f(p, sum);
  std::vector<float> out(big.size());
  f.read_f32("big", {5'000'000}, out.data());
  EXPECT_EQ(out, big);
  std::vector<float> out2(big2.size());
  f.read_f32("big2", {3'000'001}, out2.data());
  EXPECT_EQ(out2, big2);
  std::vector<float> s(7);
  f.read_f32("small1", {7}, s.data());
  EXPECT_EQ(s, small);
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  std::vector<float> w(6);
  const std::string p = path("bad.safetensors");
  std::string msg = error_of([&] {
    cleave::write_safetensors(p, {{"w", "F32", {2, 2}, w.data(), 24}}, {});
  });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  msg = error_of([&] {
    cleave::write_safetensors(p, {{"w", "F32", {6}, w.data(), 24}, {"w", "F32", {6}, w.data(), 24}},
                              {});
  });
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
  msg = error_of([&] { cleave::write_safetensors(p, {{"w", "Q4", {6}, w.data(), 24}}, {}); });
  EXPECT_NE(msg.find("unknown dtype"), std::string::npos) << msg;
  msg = error_of([&] { cleave::write_safetensors(path("no/such/dir/x.safetensors"), {}, {}); });
  EXPECT_NE(msg.find("no/such/dir/x.safetensors"), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, TruncatedFileRejectedWithPath) {
  std::vector<float> w(100, 1.0f);
  const std::string p = path("t.safetensors");
  cleave::write_safetensors(p, {{"w", "F32", {100}, w.data(), 400}}, {});
  std::vector<char> bytes = slurp(p);

  // Data cut short: the offsets claim more bytes than the file has.
  spit(p, std::vector<char>(bytes.begin(), bytes.end() - 10));
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("outside the data section"), std::string::npos) << msg;

  // Header cut short: the header length exceeds the file.
  spit(p, std::vector<char>(bytes.begin(), bytes.begin() + 20));
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("header length"), std::string::npos) << msg;

  // Shorter than the length field.
  spit(p, std::vector<char>(bytes.begin(), bytes.begin() + 5));
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;

  // Trailing bytes after the last tensor are rejected too.
  std::vector<char> longer = bytes;
  longer.push_back('x');
  spit(p, longer);
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find("after the last tensor"), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, GarbageAndMissingFilesRejected) {
  const std::string p = path("garbage.safetensors");
  std::vector<char> junk(4096);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 2654435761u) >> 13);
  spit(p, junk);
  std::string msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;

  // A plausible length but not JSON.
  write_raw(p, "not json at all!", {});
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("not JSON"), std::string::npos) << msg;

  // JSON, but not an object.
  write_raw(p, "[1, 2, 3]       ", {});
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_NE(msg.find("not a JSON object"), std::string::npos) << msg;

  const std::string missing = path("missing.safetensors");
  msg = error_of([&] { SafetensorsFile f(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, InvalidEntriesRejected) {
  const std::string p = path("bad.safetensors");
  std::vector<char> data(24, 0);
  auto check = [&](const std::string& header, const std::string& expect) {
    write_raw(p, header, data);
    std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << "expected '" << expect << "' in: " << msg;
  };
  check(R"({"w": {"shape": [6], "data_offsets": [0, 24]}})", "dtype");
  check(R"({"w": {"dtype": "F32", "data_offsets": [0, 24]}})", "shape");
  check(R"({"w": {"dtype": "F32", "shape": [6]}})", "data_offsets");
  check(R"({"w": {"dtype": "F32", "shape": [6], "data_offsets": [0, 32]}})",
        "outside the data section");
  check(R"({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 24]}})", "needs 20 bytes");
  check(R"({"w": {"dtype": "F32", "shape": [-6], "data_offsets": [0, 24]}})", "invalid shape");
  check(R"({"w": {"dtype": "X9", "shape": [6], "data_offsets": [0, 24]}})", "unknown dtype");
  check(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "v": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
        "tensor 'v' at bytes [8, 24) of the data section overlaps tensor 'w', which ends at byte 16");
  check(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "v": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})",
        "tensor 'v' at bytes [16, 24) of the data section leaves a gap after tensor 'w'");
  check(
      R"({"__metadata__": {"a": 1}, "w": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]}})",
      "not a string");
  // The same layout, well-formed, is accepted.
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", data);
  SafetensorsFile ok(p);
  EXPECT_EQ(ok.tensors().at("w").shape, (std::vector<int64_t>{2, 3}));
}

TEST_F(SafetensorsTest, ShapeDtypeAndMissingTensorMessages) {
  std::vector<float> w(6, 1.0f);
  std::vector<int32_t> ids(4, 3);
  const std::string p = path("s.safetensors");
  cleave::write_safetensors(
      p, {{"blocks.0.attn.wq", "F32", {2, 3}, w.data(), 24}, {"ids", "I32", {4}, ids.data(), 16}},
      {});
  SafetensorsFile f(p);
  std::vector<float> out(6);
  std::string msg = error_of([&] { f.read_f32("blocks.0.attn.wq", {3, 2}, out.data()); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("blocks.0.attn.wq"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected shape [3, 2], found [2, 3]"), std::string::npos) << msg;

  msg = error_of([&] { f.read_f32("ids", {4}, out.data()); });
  EXPECT_NE(msg.find("expected dtype F32, found I32"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;

  msg = error_of([&] { f.read_f32("blocks.9.mlp.w1", {2, 3}, out.data()); });
  EXPECT_NE(msg.find("blocks.9.mlp.w1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, ChunkChecksumsStableAndSensitive) {
  // 3,000 floats in chunks of 4,096 bytes: chunks of 1,024, 1,024 and 952 elements.
  std::vector<float> w(3000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) / 7.0f;
  std::vector<TensorView> t = {{"w", "F32", {30, 100}, w.data(), w.size() * 4}};
  const std::string a = path("a.safetensors"), b = path("b.safetensors");
  const cleave::FileChecksums sa = cleave::write_safetensors(a, t, {{"k", "v"}}, 4096);
  const cleave::FileChecksums sb = cleave::write_safetensors(b, t, {{"k", "v"}}, 4096);
  EXPECT_EQ(sa.to_json(), sb.to_json());  // same content, same checksums
  ASSERT_EQ(sa.chunks.at("w").size(), 3u);
  EXPECT_EQ(sa.bytes, fs::file_size(a));

  std::vector<char> bytes = slurp(a);
  bytes[bytes.size() - 12 - 4096] ^= 0x10;  // one bit in the second chunk
  spit(a, bytes);
  // The file still parses (only data changed) and opens; the damaged chunk is refused when read,
  // and bytes of the other chunks still read.
  SafetensorsFile f(a, sa);
  std::vector<float> got(3000);
  f.read_f32_elements("w", 3000, 0, 1024, got.data());
  f.read_f32_elements("w", 3000, 2048, 952, got.data() + 2048);
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 1024, w.begin()));
  EXPECT_TRUE(std::equal(got.begin() + 2048, got.end(), w.begin() + 2048));
  EXPECT_EQ(f.bytes_read(), 8 + (fs::file_size(a) - 12000 - 8) + 4096 + 3808);
  std::string msg = error_of([&] { f.read_f32_elements("w", 3000, 1500, 1, got.data()); });
  EXPECT_NE(msg.find("checksum mismatch in " + a + ": tensor 'w' bytes [4096, 8192): expected " +
                     sa.chunks.at("w")[1]),
            std::string::npos)
      << msg;
  msg = error_of([&] { f.verify_all(); });
  EXPECT_NE(msg.find("bytes [4096, 8192)"), std::string::npos) << msg;
  // A reader of the whole file's checksum (format 3) refuses it on opening.
  const std::string whole = cleave::file_checksum(b);
  msg = error_of([&] { SafetensorsFile g(a, whole); });
  EXPECT_NE(msg.find("checksum mismatch in " + a + ": expected " + whole), std::string::npos) << msg;
  EXPECT_NO_THROW(SafetensorsFile g(b, whole));
  // Checksums that do not cover the file's tensors are refused on opening.
  cleave::FileChecksums wrong = sb;
  wrong.chunks["w"].pop_back();
  msg = error_of([&] { SafetensorsFile g(b, wrong); });
  EXPECT_NE(msg.find("records 2 chunk checksums for tensor 'w', which has 3"), std::string::npos)
      << msg;

  const std::string missing = path("missing");
  msg = error_of([&] { cleave::file_checksum(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, PartialReadsCrossChunks) {
  // Reads of any range, whole chunks or parts of them, return the written elements.
  std::vector<float> w(5000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  const std::string p = path("p.safetensors");
  const cleave::FileChecksums sums =
      cleave::write_safetensors(p, {{"w", "F32", {5000}, w.data(), 20000}}, {}, 4096);
  SafetensorsFile f(p, sums);
  for (auto [begin, count] : std::vector<std::pair<int, int>>{
           {0, 5000}, {1, 1}, {1000, 100}, {1020, 10}, {1024, 1024}, {4095, 905}, {3, 4500}}) {
    std::vector<float> got(static_cast<size_t>(count));
    f.read_f32_elements("w", 5000, begin, count, got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), w.begin() + begin)) << begin << " " << count;
  }
}

TEST_F(SafetensorsTest, ChecksumOfKnownContent) {
  // XXH64 with seed 0 of the empty input is the reference value ef46db3751d8e999.
  spit(path("empty"), {});
  EXPECT_EQ(cleave::file_checksum(path("empty")), "ef46db3751d8e999");
}
