// Byte-level byte-pair encoding, as Hugging Face's tokenizers runs a BPE model over GPT-2's
// byte alphabet (GPT-2, Llama 3, Qwen and most byte-level BPE vocabularies since).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cleave {

// GPT-2's byte alphabet: every byte value stands for one printable character, so that any byte
// string is a string of vocabulary characters and no vocabulary entry holds a space or a control
// character. The printable bytes of Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves; the other 68, in increasing order, for U+0100, U+0101, ... (the space, 0x20, is
// U+0120 'Ġ'; the newline 'Ċ').
// Appends the byte-level characters (UTF-8) of `bytes` to out.
void append_byte_level(std::string_view bytes, std::string& out);
// The byte the character `codepoint` stands for, or -1 when it is none of the 256.
int byte_level_byte(uint32_t codepoint);

// A BPE model: a vocabulary of tokens and a ranked list of merges. A word (one piece of the
// pre-tokenized text, in byte-level characters) starts as its characters; the adjacent pair with
// the lowest-ranked merge is joined, the leftmost first among pairs of the same rank, until no
// adjacent pair has a merge. This is the order Hugging Face's tokenizers merges in (its Word's
// priority queue of rank then position) and transformers.js too.
class BpeModel {
 public:
  using Merge = std::pair<std::string, std::string>;
  // merges[i] has rank i; both sides and their concatenation must be tokens of `vocab` (otherwise
  // an error naming `where`[i] and the missing token). A pair listed twice keeps its later rank, as
  // in Hugging Face's map. ignore_merges: a word that is itself a token is that token, whatever
  // the merges would make of it (Llama 3 sets it).
  BpeModel(std::unordered_map<std::string, uint32_t> vocab, const std::vector<Merge>& merges,
           bool ignore_merges, const std::string& where);

  // Appends the ids of the word's tokens to out. Every character of the word must be a token
  // (true of byte-level words over a vocabulary holding the 256 byte characters).
  void encode(std::string_view word, std::vector<uint32_t>& out) const;

  const std::unordered_map<std::string, uint32_t>& vocab() const { return vocab_; }
  size_t merge_count() const { return merges_.size(); }
  // The merges in rank order (a pair listed twice once, at its later rank).
  std::vector<Merge> merges() const;

 private:
  struct Ranked {
    uint32_t rank, merged;
  };
  static uint64_t key(uint32_t left, uint32_t right) { return uint64_t(left) << 32 | right; }
  const Ranked* find(uint32_t left, uint32_t right) const;

  std::unordered_map<std::string, uint32_t> vocab_;
  std::unordered_map<uint64_t, Ranked> merges_;  // (left id, right id) -> rank, merged id
  bool ignore_merges_;
};

}  // namespace cleave
