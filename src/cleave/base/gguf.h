// GGUF, version 3: the model file of ggml and llama.cpp (ggml's docs/gguf.md). Little-endian: the
// magic "GGUF", the version, the tensor and key counts, the metadata (typed key/value pairs), the
// tensor table (name, dimensions innermost first, ggml type, offset into the data), then each
// tensor's bytes at a multiple of the alignment. This is the container alone; what llama.cpp reads
// from it (keys, tensor names and layouts) is the exporter's (model/gguf_model.h,
// data/gguf_tokenizer.h).
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

namespace cleave::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kVersion = 3;
constexpr uint32_t kAlignment = 32;      // written as general.alignment

// ggml's tensor types that cleave writes (ggml_type's values).
enum class TensorType : uint32_t { f32 = 0, f16 = 1, bf16 = 30 };
uint64_t type_size(TensorType t);  // bytes per element
const char* type_name(TensorType t);

// Metadata value types (gguf_metadata_value_type's values).
enum class ValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
  array = 9, u64 = 10, i64 = 11, f64 = 12,
};

// The key/value pairs, serialized as they are added. A key is lower_snake_case segments joined by
// dots (ASCII [a-z0-9_.]); a key added twice, or malformed, is an error naming it.
class Metadata {
 public:
  void add_u32(const std::string& key, uint32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);

  uint64_t count() const { return keys_.size(); }
  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  const std::string& bytes() const { return bytes_; }

 private:
  void begin(const std::string& key, ValueType type);
  std::string bytes_;
  std::set<std::string> keys_;
};

// A tensor of the table. shape is row-major, outermost first, as cleave's tensors are; the file
// lists it reversed (ggml's ne[0] is the innermost dimension).
struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  TensorType type = TensorType::f32;

  uint64_t numel() const;
  uint64_t nbytes() const { return numel() * type_size(type); }
};

// Streams a GGUF file to `out`: the header, `meta` and general.alignment, the tensor table, then
// tensor i's bytes as `bytes(i, buffer)` fills them (exactly tensors[i].nbytes()), one tensor at a
// time, so that a model larger than memory once over can be written. Names are unique and at most
// 63 bytes (ggml's limit with its terminating zero), shapes 1 to 4 positive dimensions; a
// violation, or a tensor whose bytes have another size, is an error naming it.
void write(std::ostream& out, const Metadata& meta, const std::vector<TensorInfo>& tensors,
           const std::function<void(size_t, std::string&)>& bytes);

}  // namespace cleave::gguf
