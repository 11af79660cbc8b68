// The GGUF writer, read back by a reader of ggml's docs/gguf.md written here: header, metadata
// of each type, the tensor table (dimensions innermost first), offsets and data at multiples of
// the alignment; and its refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/base/gguf.h"
#include "test_util.h"

namespace {

using namespace cleave;

struct Reader {
  std::string b;
  size_t at = 0;
  template <typename T>
  T get() {
    EXPECT_LE(at + sizeof(T), b.size());
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    std::string s = b.substr(at, n);
    at += n;
    return s;
  }
};

struct Tensor {
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

struct File {
  uint32_t magic, version;
  std::map<std::string, std::string> values;  // key -> its value, printed
  std::vector<std::string> order;
  std::map<std::string, Tensor> tensors;
  size_t data_start;
};

std::string value(Reader& r, uint32_t type) {
  switch (gguf::ValueType(type)) {
    case gguf::ValueType::u32: return std::to_string(r.get<uint32_t>());
    case gguf::ValueType::i32: return std::to_string(r.get<int32_t>());
    case gguf::ValueType::f32: return std::to_string(r.get<float>());
    case gguf::ValueType::boolean: return r.get<uint8_t>() ? "true" : "false";
    case gguf::ValueType::string: return r.str();
    case gguf::ValueType::array: {
      const uint32_t t = r.get<uint32_t>();
      const uint64_t n = r.get<uint64_t>();
      std::string s = "[";
      for (uint64_t i = 0; i < n; ++i) s += (i ? "," : "") + value(r, t);
      return s + "]";
    }
    default: ADD_FAILURE() << "unexpected type " << type; return "";
  }
}

File read(const std::string& bytes) {
  Reader r{bytes};
  File f;
  f.magic = r.get<uint32_t>();
  f.version = r.get<uint32_t>();
  const uint64_t tensors = r.get<uint64_t>(), kvs = r.get<uint64_t>();
  for (uint64_t i = 0; i < kvs; ++i) {
    const std::string key = r.str();
    f.order.push_back(key);
    f.values[key] = value(r, r.get<uint32_t>());
  }
  for (uint64_t i = 0; i < tensors; ++i) {
    const std::string name = r.str();
    Tensor t;
    const uint32_t n = r.get<uint32_t>();
    for (uint32_t d = 0; d < n; ++d) t.dims.push_back(r.get<uint64_t>());
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    f.tensors[name] = t;
  }
  f.data_start = (r.at + 31) / 32 * 32;
  return f;
}

std::string write(const gguf::Metadata& meta, const std::vector<gguf::TensorInfo>& tensors) {
  std::ostringstream out;
  gguf::write(out, meta, tensors, [&](size_t i, std::string& bytes) {
    // Tensor i's bytes are i + 1, repeated.
    bytes.assign(tensors[i].nbytes(), char(i + 1));
  });
  return out.str();
}

TEST(Gguf, HeaderMetadataTableAndAlignedData) {
  gguf::Metadata meta;
  meta.add_string("general.architecture", "llama");
  meta.add_u32("llama.block_count", 2);
  meta.add_f32("llama.rope.freq_base", 10000.0f);
  meta.add_bool("tokenizer.ggml.add_bos_token", false);
  meta.add_strings("tokenizer.ggml.tokens", {"a", "", "[PAD2]"});
  meta.add_f32s("tokenizer.ggml.scores", {0.5f, -1.0f});
  meta.add_i32s("tokenizer.ggml.token_type", {1, 3, 5});
  const std::vector<gguf::TensorInfo> tensors = {
      {"token_embd.weight", {5, 3}, gguf::TensorType::f16},  // 30 bytes: padded to 32
      {"blk.0.ffn_gate_exps.weight", {4, 3, 2}, gguf::TensorType::bf16},
      {"output_norm.weight", {3}, gguf::TensorType::f32},
  };
  const std::string bytes = write(meta, tensors);
  const File f = read(bytes);
  EXPECT_EQ(f.magic, 0x46554747u);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  EXPECT_EQ(f.version, 3u);
  EXPECT_EQ(f.order.back(), "general.alignment");
  EXPECT_EQ(f.values.at("general.alignment"), "32");
  EXPECT_EQ(f.values.at("general.architecture"), "llama");
  EXPECT_EQ(f.values.at("llama.block_count"), "2");
  EXPECT_EQ(f.values.at("llama.rope.freq_base"), "10000.000000");
  EXPECT_EQ(f.values.at("tokenizer.ggml.add_bos_token"), "false");
  EXPECT_EQ(f.values.at("tokenizer.ggml.tokens"), "[a,,[PAD2]]");
  EXPECT_EQ(f.values.at("tokenizer.ggml.scores"), "[0.500000,-1.000000]");
  EXPECT_EQ(f.values.at("tokenizer.ggml.token_type"), "[1,3,5]");

  const Tensor& embd = f.tensors.at("token_embd.weight");
  EXPECT_EQ(embd.dims, (std::vector<uint64_t>{3, 5}));  // innermost first
  EXPECT_EQ(embd.type, 1u);
  EXPECT_EQ(embd.offset, 0u);
  const Tensor& exps = f.tensors.at("blk.0.ffn_gate_exps.weight");
  EXPECT_EQ(exps.dims, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(exps.type, 30u);
  EXPECT_EQ(exps.offset, 32u);
  const Tensor& norm = f.tensors.at("output_norm.weight");
  EXPECT_EQ(norm.type, 0u);
  EXPECT_EQ(norm.offset, 32u + 64u);  // 48 bytes padded to 64
  EXPECT_EQ(f.data_start % 32, 0u);
  // The padding is zeros; each tensor's bytes are where its offset says.
  EXPECT_EQ(bytes.size(), f.data_start + 96 + 32);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = f.tensors.at(tensors[i].name);
    const size_t at = f.data_start + t.offset, n = tensors[i].nbytes();
    EXPECT_EQ(bytes.substr(at, n), std::string(n, char(i + 1))) << tensors[i].name;
    const size_t pad = (32 - n % 32) % 32;
    EXPECT_EQ(bytes.substr(at + n, pad), std::string(pad, '\0')) << tensors[i].name;
  }
}

TEST(Gguf, RefusesMalformedKeysNamesShapesAndSizes) {
  gguf::Metadata meta;
  meta.add_u32("llama.block_count", 2);
  EXPECT_THROW(meta.add_u32("llama.block_count", 3), Error);  // twice
  EXPECT_THROW(meta.add_u32("Llama.Block", 3), Error);
  EXPECT_THROW(meta.add_u32("llama..x", 3), Error);
  EXPECT_THROW(meta.add_u32("", 3), Error);
  gguf::Metadata aligned;
  aligned.add_u32("general.alignment", 64);
  EXPECT_THROW(write(aligned, {}), Error);  // the writer's own key

  auto fails = [&](const std::vector<gguf::TensorInfo>& t, const std::string& says) {
    const std::string e = test_util::error_of([&] { write(meta, t); });
    EXPECT_NE(e.find(says), std::string::npos) << e;
  };
  fails({{std::string(64, 'x'), {2}, gguf::TensorType::f32}}, "must have 1 to 63 bytes");
  fails({{"a", {2}, gguf::TensorType::f32}, {"a", {2}, gguf::TensorType::f32}}, "listed twice");
  fails({{"a", {1, 1, 1, 1, 1}, gguf::TensorType::f32}}, "5 dimensions");
  fails({{"a", {2, 0}, gguf::TensorType::f32}}, "a dimension of 0");

  // A tensor whose bytes have another size than its shape and type say.
  std::ostringstream out;
  const std::string e = test_util::error_of([&] {
    gguf::write(out, meta, {{"w", {2, 2}, gguf::TensorType::bf16}},
                [](size_t, std::string& bytes) { bytes.assign(16, '\0'); });
  });
  EXPECT_NE(e.find("'w' came with 16 bytes, not 8"), std::string::npos) << e;
}

}  // namespace
