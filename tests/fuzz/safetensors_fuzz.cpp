// The input is a safetensors file. SafetensorsFile must refuse it (naming the file) or hand out
// tensors whose every byte lies in the file: each is read into a buffer of exactly its size, so
// AddressSanitizer sees any byte copied past it, and a read with another dtype or shape must be
// refused. A folder or a device is refused by name.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cleave/checkpoint/safetensors.h"
#include "fuzz_util.h"

namespace {

using namespace cleave;

// Element sizes as the safetensors format defines them; 0 for a dtype not listed.
uint64_t element_bytes(const std::string& dtype) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Not the FIFO: SafetensorsFile opens a file before it checks its type, and opening a FIFO
  // blocks until a writer comes (read_checkpoint_folder checks the type first: meta_json_fuzz).
  const std::vector<std::string>& special = fuzz::special_files();
  fuzz::refuses_once({special[0], special[2]}, [](const std::string& p) { SafetensorsFile{p}; });
  const std::string path = fuzz::scratch() + "/input.safetensors";
  fuzz::write_bytes(path, {reinterpret_cast<const char*>(data), size});
  fuzz::accepted(
      [&] {
        const SafetensorsFile file(path);
        for (const auto& entry : file.tensors()) {
          const std::string& name = entry.first;  // named, not bound: lambdas capture them below
          const auto& info = entry.second;
          // Every element takes at least a byte of the file, so an accepted shape cannot hold
          // more elements than the file has bytes (checked before anything is allocated).
          uint64_t numel = 1;
          bool overflow = false;
          for (int64_t d : info.shape)
            overflow |= __builtin_mul_overflow(numel, uint64_t(d), &numel);
          const bool empty =
              std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end();
          if (empty) numel = 0;
          if (std::any_of(info.shape.begin(), info.shape.end(), [](int64_t d) { return d < 0; }) ||
              (overflow && !empty) || numel > size)
            fuzz::finding("tensor '" + name + "' accepted with shape " + text(info.shape) +
                          " in a file of " + std::to_string(size) + " bytes");
          const uint64_t esize = element_bytes(info.dtype);
          std::vector<char> out(esize != 0 ? numel * esize : numel * 8);
          file.read(name, info.dtype, info.shape, out.data());
          const std::string other_dtype = info.dtype == "F32" ? "I32" : "F32";
          if (fuzz::accepted([&] { file.read(name, other_dtype, info.shape, out.data()); }, path))
            fuzz::finding("tensor '" + name + "' of " + info.dtype + " read as " + other_dtype);
          // The same elements in another shape: one more axis, or the axes reversed (a
          // transposed tensor).
          std::vector<std::vector<int64_t>> other_shapes = {
              info.shape, {info.shape.rbegin(), info.shape.rend()}};
          other_shapes[0].push_back(1);
          if (other_shapes[1] == info.shape) other_shapes.pop_back();
          for (const std::vector<int64_t>& other : other_shapes)
            if (fuzz::accepted([&] { file.read(name, info.dtype, other, out.data()); }, path))
              fuzz::finding("tensor '" + name + "' of shape " + text(info.shape) + " read as " +
                            text(other));
        }
      },
      path);
  return 0;
}
