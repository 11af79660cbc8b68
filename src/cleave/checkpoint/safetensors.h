// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
// and the raw little-endian tensor bytes.
#pragma once
#include <cstdint>
#include <map>
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

// Reads a whole file and validates its header against the file size; errors name the file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Copies tensor `name` (dtype F32, shape must equal `shape`) into out; errors name file, tensor,
  // expected and found shape.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<char> bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// XXH64 of a file's contents, 16 hex digits.
std::string file_checksum(const std::string& path);

}  // namespace cleave
