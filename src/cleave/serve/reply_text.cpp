#include "cleave/serve/reply_text.h"

#include <algorithm>

namespace cleave::serve {

ReplyText::ReplyText(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : stream_(tokenizer), stops_(std::move(stops)) {
  for (const std::string& s : stops_) hold_ = std::max(hold_, s.size() - 1);
}

bool ReplyText::cut() {
  // A stop string can only be completed by the new text: search from where it could begin.
  const size_t from = shown_ > hold_ ? shown_ - hold_ : 0;
  size_t at = std::string::npos;
  for (const std::string& s : stops_) at = std::min(at, text_.find(s, from));
  if (at == std::string::npos) return false;
  text_.resize(at);
  stopped_ = true;
  return true;
}

bool ReplyText::add(int32_t id) {
  if (stopped_) return true;
  text_ += stream_.next(uint32_t(id));
  return cut();
}

std::string ReplyText::take() {
  size_t safe = text_.size();
  if (!stopped_) {
    safe = text_.size() > hold_ ? text_.size() - hold_ : 0;
    // Never cut a UTF-8 character in two.
    while (safe > shown_ && safe < text_.size() && (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80)
      --safe;
  }
  if (safe <= shown_) return "";
  std::string out = text_.substr(shown_, safe - shown_);
  shown_ = safe;
  return out;
}

std::string ReplyText::finish() {
  if (!stopped_) {
    text_ += stream_.finish();
    cut();
  }
  stopped_ = true;
  return take();
}

}  // namespace cleave::serve
