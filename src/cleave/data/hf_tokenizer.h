// A Hugging Face tokenizer.json of a byte-level BPE tokenizer (GPT-2's, Llama 3's), encoding as
// Hugging Face's tokenizers library does: added tokens are split out of the text first, each
// stretch between them is cut by the pre-tokenizer (Split patterns, ByteLevel), each piece is
// BPE-merged, and the post-processor's template puts its special tokens around the result.
// What the file asks for beyond that (another model type, a normalizer, byte fallback, other
// pre-tokenizers or decoders, truncation, padding) is refused, naming the key. docs/tokenizers.md
// lists what is read.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cleave/data/bpe.h"
#include "cleave/data/regex.h"
#include "cleave/data/tokenizer.h"

namespace cleave {

class HfTokenizer final : public Tokenizer {
 public:
  // Reads `path` (a tokenizer.json, at most 128 MiB) and the tokenizer_config.json beside it.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  std::vector<uint32_t> encode_text(std::string_view text) const override;
  std::string decode(const std::vector<uint32_t>& ids) const override;
  int vocab_size() const override { return int(tokens_.size()); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  const char* kind() const override { return "byte-level BPE"; }
  TokenizerVocabulary vocabulary() const override;

  // One pre-tokenizer step: a Split pattern, or ByteLevel (its prefix space, the GPT-2 pattern
  // when use_regex, then the byte-to-character mapping).
  struct Step {
    std::unique_ptr<TokenizerRegex> regex;  // the Split's, or ByteLevel's GPT-2 pattern
    std::string pattern;                    // the Split's ("" for ByteLevel)
    bool byte_level = false, add_prefix_space = false;
  };
  // Added tokens matched in the text, the longest at the leftmost position where any matches:
  // those not "normalized" first, then the others in what is left (Hugging Face's two passes).
  struct AddedTokens {
    std::array<std::vector<std::pair<std::string, uint32_t>>, 256> by_first_byte;  // longest first
    bool empty = true;
  };

 private:
  void pre_tokenize(std::string_view stretch, std::vector<uint32_t>& out) const;

  AddedTokens raw_added_, normalized_added_;
  std::vector<Step> steps_;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string> tokens_;  // id -> its token (byte-level text, or an added token's text)
  std::vector<bool> known_;          // ids the file assigns (a file may leave holes)
  std::vector<std::pair<uint32_t, bool>> added_;  // each added token's id, and whether special
  bool ignore_merges_ = false;
  int bos_ = -1, eos_ = -1;
};

}  // namespace cleave
