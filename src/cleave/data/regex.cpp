#include "cleave/data/regex.h"

#include <oniguruma.h>

#include <memory>
#include <mutex>

#include "cleave/base/check.h"
#include "cleave/data/utf8.h"

namespace cleave {

namespace {

// Oniguruma's global state (its encoding tables) is set up once, and compiling is not safe to run
// on several threads at once; searching a compiled pattern is.
std::mutex& compile_mutex() {
  static std::mutex m;
  return m;
}

void initialize_once() {
  static const bool done = [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    return onig_initialize(encodings, 1) == ONIG_NORMAL;
  }();
  CLEAVE_CHECK(done, "cannot initialise Oniguruma, the regular expression library");
}

std::string onig_message(int code, OnigErrorInfo* info) {
  UChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), size_t(n > 0 ? n : 0));
}

}  // namespace

TokenizerRegex::TokenizerRegex(const std::string& pattern, std::string where)
    : where_(std::move(where)) {
  const size_t bad = first_invalid_utf8(pattern);
  CLEAVE_CHECK(bad == std::string::npos,
               where_ << ": the pattern is not valid UTF-8 (at byte " << bad << ")");
  std::lock_guard<std::mutex> lock(compile_mutex());
  initialize_once();
  OnigErrorInfo info{};
  const auto* p = reinterpret_cast<const UChar*>(pattern.data());
  const int r = onig_new(&regex_, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                         ONIG_SYNTAX_DEFAULT, &info);
  if (r != ONIG_NORMAL) {
    regex_ = nullptr;
    CLEAVE_FAIL(where_ << ": the pattern " << pattern
                       << " does not compile: " << onig_message(r, &info));
  }
}

TokenizerRegex::~TokenizerRegex() {
  if (regex_) onig_free(regex_);
}

void TokenizerRegex::split_isolated(std::string_view text,
                                    std::vector<std::string_view>& pieces) const {
  std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(
      onig_region_new(), [](OnigRegion* r) { onig_region_free(r, 1); });
  CLEAVE_CHECK(region, where_ << ": out of memory");
  const auto* begin = reinterpret_cast<const UChar*>(text.data());
  const auto* end = begin + text.size();
  size_t from = 0, cut = 0;  // where the next search starts; where the current piece starts
  bool skip_empty = false;   // an empty match right after a match is not one
  while (from <= text.size()) {
    onig_region_clear(region.get());
    const int r = onig_search(regex_, begin, end, begin + from, end, region.get(),
                              ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) CLEAVE_FAIL(where_ << ": matching failed: " << onig_message(r, nullptr));
    const size_t s = size_t(region->beg[0]), e = size_t(region->end[0]);
    from = e;
    if (s == e) {
      const size_t n = e < text.size() ? utf8_char_length(text, e) : 1;
      from += n > 0 ? n : 1;
      if (skip_empty) {
        skip_empty = false;
        continue;
      }
    } else {
      skip_empty = true;
    }
    if (s > cut) pieces.push_back(text.substr(cut, s - cut));
    if (e > s) pieces.push_back(text.substr(s, e - s));
    cut = e;
  }
  if (cut < text.size()) pieces.push_back(text.substr(cut));
}

}  // namespace cleave
