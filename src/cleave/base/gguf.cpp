#include "cleave/base/gguf.h"

#include <bit>
#include <cstring>

#include "cleave/base/check.h"

namespace cleave::gguf {

static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");

namespace {

constexpr size_t kMaxNameBytes = 63;
constexpr int kMaxDims = 4;

template <typename T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}

void put_string(std::string& s, const std::string& v) {
  put<uint64_t>(s, v.size());
  s += v;
}

void check_key(const std::string& key) {
  bool ok = !key.empty() && key.size() <= 65535 && key.front() != '.' && key.back() != '.' &&
            key.find("..") == std::string::npos;
  for (char c : key) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.');
  CLEAVE_CHECK(ok, "GGUF key '" << key << "' is not dot-separated lower_snake_case ASCII");
}

}  // namespace

uint64_t type_size(TensorType t) { return t == TensorType::f32 ? 4 : 2; }

const char* type_name(TensorType t) {
  switch (t) {
    case TensorType::f32: return "f32";
    case TensorType::f16: return "f16";
    case TensorType::bf16: return "bf16";
  }
  return "?";
}

void Metadata::begin(const std::string& key, ValueType type) {
  check_key(key);
  CLEAVE_CHECK(keys_.insert(key).second, "GGUF key '" << key << "' is given twice");
  put_string(bytes_, key);
  put<uint32_t>(bytes_, uint32_t(type));
}

void Metadata::add_u32(const std::string& key, uint32_t v) {
  begin(key, ValueType::u32);
  put(bytes_, v);
}

void Metadata::add_f32(const std::string& key, float v) {
  begin(key, ValueType::f32);
  put(bytes_, v);
}

void Metadata::add_bool(const std::string& key, bool v) {
  begin(key, ValueType::boolean);
  put<uint8_t>(bytes_, v ? 1 : 0);
}

void Metadata::add_string(const std::string& key, const std::string& v) {
  begin(key, ValueType::string);
  put_string(bytes_, v);
}

void Metadata::add_strings(const std::string& key, const std::vector<std::string>& v) {
  begin(key, ValueType::array);
  put<uint32_t>(bytes_, uint32_t(ValueType::string));
  put<uint64_t>(bytes_, v.size());
  for (const std::string& s : v) put_string(bytes_, s);
}

void Metadata::add_f32s(const std::string& key, const std::vector<float>& v) {
  begin(key, ValueType::array);
  put<uint32_t>(bytes_, uint32_t(ValueType::f32));
  put<uint64_t>(bytes_, v.size());
  for (float x : v) put(bytes_, x);
}

void Metadata::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  begin(key, ValueType::array);
  put<uint32_t>(bytes_, uint32_t(ValueType::i32));
  put<uint64_t>(bytes_, v.size());
  for (int32_t x : v) put(bytes_, x);
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

void write(std::ostream& out, const Metadata& meta, const std::vector<TensorInfo>& tensors,
           const std::function<void(size_t, std::string&)>& bytes) {
  CLEAVE_CHECK(!meta.has("general.alignment"),
               "general.alignment is the GGUF writer's own key (" << kAlignment << ")");
  const auto padding = [](uint64_t at) { return (kAlignment - at % kAlignment) % kAlignment; };
  std::string head;
  put<uint32_t>(head, kMagic);
  put<uint32_t>(head, kVersion);
  put<uint64_t>(head, tensors.size());
  put<uint64_t>(head, meta.count() + 1);
  head += meta.bytes();
  put_string(head, "general.alignment");
  put<uint32_t>(head, uint32_t(ValueType::u32));
  put<uint32_t>(head, kAlignment);
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    CLEAVE_CHECK(!t.name.empty() && t.name.size() <= kMaxNameBytes,
                 "GGUF tensor name '" << t.name << "' must have 1 to " << kMaxNameBytes << " bytes");
    CLEAVE_CHECK(names.insert(t.name).second, "GGUF tensor '" << t.name << "' is listed twice");
    CLEAVE_CHECK(!t.shape.empty() && int(t.shape.size()) <= kMaxDims,
                 "GGUF tensor '" << t.name << "' has " << t.shape.size() << " dimensions, not 1 to "
                                 << kMaxDims);
    for (int64_t d : t.shape)
      CLEAVE_CHECK(d > 0, "GGUF tensor '" << t.name << "' has a dimension of " << d);
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) put<uint64_t>(head, uint64_t(*d));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, offset);
    offset += t.nbytes() + padding(t.nbytes());
  }
  head.append(padding(head.size()), '\0');
  out.write(head.data(), std::streamsize(head.size()));
  const std::string zeros(kAlignment, '\0');
  std::string buffer;
  for (size_t i = 0; i < tensors.size() && out; ++i) {
    buffer.clear();
    bytes(i, buffer);
    const uint64_t n = tensors[i].nbytes();
    CLEAVE_CHECK(buffer.size() == n, "GGUF tensor '" << tensors[i].name << "' came with "
                                                      << buffer.size() << " bytes, not " << n);
    out.write(buffer.data(), std::streamsize(n));
    out.write(zeros.data(), std::streamsize(padding(n)));
  }
}

}  // namespace cleave::gguf
