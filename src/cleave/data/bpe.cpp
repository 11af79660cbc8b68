#include "cleave/data/bpe.h"

#include <algorithm>
#include <array>
#include <queue>

#include "cleave/base/check.h"
#include "cleave/data/utf8.h"

namespace cleave {

namespace {

bool stands_for_itself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteAlphabet {
  std::array<std::string, 256> chars;   // byte -> its character, UTF-8
  std::array<int16_t, 256 + 68> bytes;  // code point -> byte, -1 for none
  ByteAlphabet() {
    bytes.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = stands_for_itself(b) ? uint32_t(b) : next++;
      append_utf8(cp, chars[size_t(b)]);
      bytes[cp] = int16_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

void append_byte_level(std::string_view bytes, std::string& out) {
  const ByteAlphabet& a = alphabet();
  for (char c : bytes) out += a.chars[uint8_t(c)];
}

int byte_level_byte(uint32_t codepoint) {
  const ByteAlphabet& a = alphabet();
  return codepoint < a.bytes.size() ? a.bytes[codepoint] : -1;
}

BpeModel::BpeModel(std::unordered_map<std::string, uint32_t> vocab,
                   const std::vector<Merge>& merges, bool ignore_merges, const std::string& where)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  merges_.reserve(merges.size());
  auto id_of = [&](const std::string& token, size_t i) {
    const auto it = vocab_.find(token);
    CLEAVE_CHECK(it != vocab_.end(), where << "[" << i << "] (\"" << merges[i].first << "\", \""
                                           << merges[i].second << "\"): \"" << token
                                           << "\" is not in the vocabulary");
    return it->second;
  };
  for (size_t i = 0; i < merges.size(); ++i) {
    const uint32_t left = id_of(merges[i].first, i), right = id_of(merges[i].second, i);
    const uint32_t merged = id_of(merges[i].first + merges[i].second, i);
    merges_[key(left, right)] = Ranked{uint32_t(i), merged};
  }
}

std::vector<BpeModel::Merge> BpeModel::merges() const {
  std::vector<const std::string*> token(vocab_.size() + 1, nullptr);
  for (const auto& [text, id] : vocab_) {
    if (id >= token.size()) token.resize(size_t(id) + 1, nullptr);
    token[id] = &text;
  }
  std::vector<std::pair<uint32_t, uint64_t>> by_rank;  // rank, (left, right)
  by_rank.reserve(merges_.size());
  for (const auto& [pair, ranked] : merges_) by_rank.emplace_back(ranked.rank, pair);
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<Merge> out;
  out.reserve(by_rank.size());
  for (const auto& [rank, pair] : by_rank)
    out.emplace_back(*token[pair >> 32], *token[uint32_t(pair)]);
  return out;
}

const BpeModel::Ranked* BpeModel::find(uint32_t left, uint32_t right) const {
  const auto it = merges_.find(key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // The word's symbols as a linked list over their first positions; a joined symbol keeps the
  // left one's slot and the right one's is unlinked.
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
  };
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < word.size();) {
    const size_t n = utf8_char_length(word, i);
    CLEAVE_CHECK(n > 0, "BPE: word is not valid UTF-8 at byte " << i);
    const auto it = vocab_.find(std::string(word.substr(i, n)));
    CLEAVE_CHECK(it != vocab_.end(),
                 "BPE: character \"" << word.substr(i, n) << "\" is not in the vocabulary");
    const int32_t pos = int32_t(symbols.size());
    symbols.push_back({it->second, pos - 1, pos + 1});
    i += n;
  }
  symbols.back().next = -1;

  // Candidate joins, lowest rank first and then leftmost. A candidate goes stale when either of
  // its symbols has been joined into another since; it is checked when it comes out.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || symbols[size_t(pos)].next < 0) return;
    const Ranked* m = find(symbols[size_t(pos)].id, symbols[size_t(symbols[size_t(pos)].next)].id);
    if (m) queue.push({m->rank, pos});
  };
  for (int32_t p = 0; p + 1 < int32_t(symbols.size()); ++p) consider(p);
  std::vector<bool> gone(symbols.size(), false);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(c.pos)];
    if (gone[size_t(c.pos)] || left.next < 0) continue;
    const Ranked* m = find(left.id, symbols[size_t(left.next)].id);
    if (!m || m->rank != c.rank) continue;
    const int32_t right = left.next;
    left.id = m->merged;
    left.next = symbols[size_t(right)].next;
    if (left.next >= 0) symbols[size_t(left.next)].prev = c.pos;
    gone[size_t(right)] = true;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t p = 0; p >= 0; p = symbols[size_t(p)].next) out.push_back(symbols[size_t(p)].id);
}

}  // namespace cleave
