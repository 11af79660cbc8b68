// UTF-8 as the tokenizers need it: text in is checked, bytes out are made text the way Rust's
// String::from_utf8_lossy and the WHATWG decoder do it, so a decoded id sequence that ends inside a
// character reads the same here as in Hugging Face's tokenizers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cleave {

// The length of the well-formed UTF-8 character at text[i], or 0 if the bytes there are not one
// (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, or cut off by the end).
size_t utf8_char_length(std::string_view text, size_t i);

// The offset of the first byte that is not part of a well-formed character, or npos if the whole
// text is valid UTF-8.
size_t first_invalid_utf8(std::string_view text);

// `bytes` as text: each maximal ill-formed subsequence (Unicode's "maximal subpart") becomes one
// U+FFFD; well-formed characters are kept.
std::string utf8_lossy(std::string_view bytes);

// Appends the UTF-8 form of the code point (which must be at most U+10FFFF).
void append_utf8(uint32_t codepoint, std::string& out);

// The code point of the well-formed character at text[i] of length n (from utf8_char_length).
uint32_t utf8_decode(std::string_view text, size_t i, size_t n);

}  // namespace cleave
