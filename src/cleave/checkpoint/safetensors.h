// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
// and the raw little-endian tensor bytes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cleave {

struct TensorView {  // what a writer is given: bytes that live elsewhere
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// Writes the file (not atomically; callers write into a temporary folder). Returns the XXH64 of the
// whole file as 16 hex digits.
std::string write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata);

struct TensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

// Maps a whole file read-only and validates its header against the file size; errors name the
// file. The file must not be truncated while the object lives (checkpoint files never are).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Also checks the file's XXH64 (computed over the whole file before the header is parsed)
  // against `expected_checksum`: "checksum mismatch in <path>: expected X, found Y; ...".
  SafetensorsFile(const std::string& path, const std::string& expected_checksum);
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Copies tensor `name` (dtype F32, shape must equal `shape`) into out; errors name file, tensor,
  // expected and found shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  // Same for any dtype: copies end-begin bytes of tensor `name` into out after checking its dtype
  // and shape.
  void read(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
            void* out) const;
  // Elements [begin, begin + count) of F32 tensor `name`, which must hold `numel` elements.
  void read_f32_elements(const std::string& name, int64_t numel, int64_t begin, int64_t count,
                         float* out) const;
  // XXH64 of the whole file, 16 hex digits (always computed on opening).
  const std::string& checksum() const { return checksum_; }
  const std::string& path() const { return path_; }

 private:
  void load(const std::string* expected_checksum);
  const TensorInfo& find(const std::string& name) const;

  std::string path_;
  std::string checksum_;
  std::shared_ptr<const char> bytes_;  // the file, mapped read-only (shared by copies)
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// "[2304, 768]": a shape as error messages print it.
std::string shape_text(const std::vector<int64_t>& shape);

// XXH64 of a file's contents, 16 hex digits.
std::string file_checksum(const std::string& path);

// Bytes per element of a safetensors dtype ("F32" -> 4); 0 for an unknown dtype.
uint64_t safetensors_dtype_size(const std::string& dtype);

}  // namespace cleave
