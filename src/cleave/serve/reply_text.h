// A reply's text as its tokens come, cut at the first stop string (OpenAI's stop: the reply ends
// before it and does not hold it). While streaming, the tail that a stop string could still
// begin in is held back, so that no client ever sees part of a stop string.
#pragma once
#include <string>
#include <vector>

#include "cleave/data/tokenizer.h"

namespace cleave::serve {

class ReplyText {
 public:
  ReplyText(const Tokenizer& tokenizer, std::vector<std::string> stops);
  // Adds a token's text; true when a stop string is complete (the text now ends before it).
  bool add(int32_t id);
  // The text not shown yet that no stop string can still begin in (all of it once stopped).
  std::string take();
  // The rest, at the reply's end.
  std::string finish();
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  bool cut();
  DecodeStream stream_;
  std::vector<std::string> stops_;
  std::string text_;
  size_t shown_ = 0, hold_ = 0;
  bool stopped_ = false;
};

}  // namespace cleave::serve
