#include "cleave/data/utf8.h"

namespace cleave {

namespace {

// How many bytes of a character the lead byte b announces (0: b cannot start one), and the range
// its second byte must fall in: the first continuation byte is narrowed to exclude overlong forms
// (E0, F0), surrogates (ED) and code points past U+10FFFF (F4); the rest are always 80..BF.
struct Lead {
  int length;
  uint8_t lo, hi;
};

Lead lead_of(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes from text[i] on form the longest prefix of a well-formed character (at least 1:
// the lead byte alone when nothing follows it correctly), and whether that prefix is the whole
// character.
size_t valid_prefix(std::string_view text, size_t i, bool* complete) {
  const Lead lead = lead_of(uint8_t(text[i]));
  *complete = lead.length == 1;
  if (lead.length <= 1) return 1;
  size_t n = 1;
  for (int k = 1; k < lead.length; ++k, ++n) {
    if (i + n >= text.size()) return n;
    const uint8_t c = uint8_t(text[i + n]);
    const uint8_t lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) return n;
  }
  *complete = true;
  return n;
}

}  // namespace

size_t utf8_char_length(std::string_view text, size_t i) {
  bool complete = false;
  const size_t n = valid_prefix(text, i, &complete);
  return complete ? n : 0;
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_char_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool complete = false;
    const size_t n = valid_prefix(bytes, i, &complete);
    if (complete) out.append(bytes.substr(i, n));
    else out += "\xEF\xBF\xBD";
    i += n;
  }
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_decode(std::string_view text, size_t i, size_t n) {
  const uint8_t b = uint8_t(text[i]);
  uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(text[i + k]) & 0x3F);
  return cp;
}

}  // namespace cleave
