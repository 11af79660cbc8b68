// The regular expressions of a Hugging Face tokenizer.json (its Split pre-tokenizers' patterns and
// ByteLevel's GPT-2 pattern), run by Oniguruma: the engine Hugging Face's tokenizers library runs
// them with, so the syntax, the Unicode classes (\p{L}, \p{N}, \s) and case folding ((?i:...))
// are its own.
#pragma once
#include <string>
#include <string_view>
#include <vector>

struct re_pattern_buffer;

namespace cleave {

class TokenizerRegex {
 public:
  // Compiles `pattern` (UTF-8, Oniguruma's default syntax); an error names `where` and the
  // engine's reason.
  TokenizerRegex(const std::string& pattern, std::string where);
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // Appends the pieces a Split with behavior "Isolated" cuts `text` into: every match and every
  // stretch between two matches, in order, empty ones left out. Matches are found left to right
  // as Hugging Face's tokenizers iterates them (an empty match right after a match is skipped; the
  // search resumes one character further after an empty match). `text` must be valid UTF-8.
  void split_isolated(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  re_pattern_buffer* regex_ = nullptr;
  std::string where_;
};

}  // namespace cleave
