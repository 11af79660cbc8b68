// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}}
// and the raw little-endian tensor bytes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cleave {

struct TensorView {  // what a writer is given: bytes that live elsewhere
  std::string name;
  std::string dtype;  // "F32", "BF16", "I32", ...
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

// What proves a file intact piece by piece, so that a reader verifies exactly the bytes it reads:
// the file's size, the XXH64 of its length field and header, and the XXH64 of each chunk of
// chunk_bytes of every tensor's bytes (the last chunk of a tensor may be shorter).
struct FileChecksums {
  uint64_t bytes = 0;
  std::string header;
  uint64_t chunk_bytes = 0;
  std::map<std::string, std::vector<std::string>> chunks;  // tensor -> one checksum per chunk

  nlohmann::json to_json() const;
  // Errors name `where` (e.g. "dir/meta.json: file model-rank00000.safetensors").
  static FileChecksums from_json(const nlohmann::json& j, const std::string& where);
};

// 1 MiB: a reader reads at most a chunk beyond each end of what it keeps, and a 124M model's
// state (1.5 GB) needs about 1,500 checksums.
constexpr uint64_t kChecksumChunkBytes = uint64_t{1} << 20;

// Writes the file (not atomically; callers write into a temporary folder), hashing every byte on
// its way out.
FileChecksums write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                uint64_t chunk_bytes = kChecksumChunkBytes);

struct TensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

// Reads only the header on opening and validates it against the file size; errors name the file.
// Tensor bytes are read with pread when asked for, so a rank reads only what it keeps (and the
// kernel's read counters see it). Not safe for concurrent use; copies share one open file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  // Checks the size and the header's checksum on opening, and each chunk of a tensor the first
  // time any of its bytes are read: "checksum mismatch in <path>: ...".
  SafetensorsFile(const std::string& path, const FileChecksums& expected);
  // Format versions 1-3: one XXH64 of the whole file, checked on opening by reading it all.
  SafetensorsFile(const std::string& path, const std::string& expected_file_checksum);

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
  // Reads and checks every chunk of every tensor (with per-chunk checksums; otherwise nothing is
  // left to check after opening).
  void verify_all() const;
  // Reads the whole file: its FileChecksums, as the writer would have returned them.
  FileChecksums compute_checksums(uint64_t chunk_bytes) const;
  // Bytes read from the file so far, header included.
  uint64_t bytes_read() const;
  const std::string& path() const { return path_; }
  uint64_t size() const;  // the file's size in bytes

 private:
  struct Open;  // the descriptor, the expected checksums, the verified chunks, the counter
  void load_header();
  const TensorInfo& find(const std::string& name) const;
  void read_bytes(const std::string& name, const TensorInfo& info, uint64_t begin, uint64_t n,
                  char* out) const;

  std::string path_;
  std::shared_ptr<Open> open_;
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
