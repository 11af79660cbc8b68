#include "cleave/data/spm_model_proto.h"

#include <cstdint>

#include "cleave/base/check.h"

namespace cleave {

namespace {

// Protocol buffers' wire format: each field a varint key (number << 3 | wire type) and a value:
// a varint (0), 8 bytes (1), a varint length and that many bytes (2), or 4 bytes (5).
struct Wire {
  std::string_view in;
  const std::string& path;
  size_t at = 0;

  bool done() const { return at >= in.size(); }
  [[noreturn]] void fail(const char* what) const {
    CLEAVE_FAIL("tokenizer model " << path << ": malformed SentencePiece model: " << what
                                   << " at byte " << at);
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) fail("a number runs past the end");
      const uint8_t b = uint8_t(in[at++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a number is longer than 10 bytes");
  }
  // The next field's number and wire type, its value read into `varint_value` or `bytes` (other
  // wire types are skipped).
  void next(uint32_t& field, uint32_t& type, uint64_t& varint_value, std::string_view& bytes) {
    const uint64_t key = varint();
    field = uint32_t(key >> 3);
    type = uint32_t(key & 7);
    auto skip = [&](uint64_t n) {
      if (n > in.size() - at) fail("a field runs past the end");
      at += size_t(n);
    };
    switch (type) {
      case 0: varint_value = varint(); break;
      case 1: skip(8); break;
      case 2: {
        const uint64_t n = varint();
        if (n > in.size() - at) fail("a field runs past the end");
        bytes = in.substr(at, size_t(n));
        at += size_t(n);
        break;
      }
      case 5: skip(4); break;
      default: fail("a field has an unknown wire type");
    }
  }
};

// Calls visit(field, wire type, varint value, bytes) for each field of `message`.
template <typename Visit>
void fields(std::string_view message, const std::string& path, Visit&& visit) {
  Wire w{message, path};
  while (!w.done()) {
    uint32_t field = 0, type = 0;
    uint64_t v = 0;
    std::string_view bytes;
    w.next(field, type, v, bytes);
    visit(field, type, v, bytes);
  }
}

}  // namespace

SpmModelFacts read_spm_model_facts(std::string_view proto, const std::string& path) {
  SpmModelFacts f;
  fields(proto, path, [&](uint32_t field, uint32_t type, uint64_t, std::string_view bytes) {
    if (type != 2) return;
    if (field == 1) {  // ModelProto.pieces: a SentencePiece {piece = 1, score = 2, type = 3}
      int piece_type = 1;
      fields(bytes, path, [&](uint32_t f2, uint32_t t2, uint64_t v, std::string_view) {
        if (f2 == 3 && t2 == 0) piece_type = int(v);
      });
      f.piece_types.push_back(piece_type);
    } else if (field == 2) {  // trainer_spec: model_type = 3
      fields(bytes, path, [&](uint32_t f2, uint32_t t2, uint64_t v, std::string_view) {
        if (f2 == 3 && t2 == 0) f.model_type = int(v);
      });
    } else if (field == 3) {  // normalizer_spec: name = 1, the whitespace flags 3, 4, 5
      fields(bytes, path, [&](uint32_t f2, uint32_t t2, uint64_t v, std::string_view s) {
        if (f2 == 1 && t2 == 2) f.normalizer = std::string(s);
        if (t2 != 0) return;
        if (f2 == 3) f.add_dummy_prefix = v != 0;
        if (f2 == 4) f.remove_extra_whitespaces = v != 0;
        if (f2 == 5) f.escape_whitespaces = v != 0;
      });
    }
  });
  return f;
}

}  // namespace cleave
