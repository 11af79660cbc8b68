// The pieces of the byte-level BPE tokenizer on tiny hand-made inputs: the merge order, the byte
// alphabet, UTF-8 in and out, and the pattern splitting.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/data/bpe.h"
#include "cleave/data/regex.h"
#include "cleave/data/utf8.h"
#include "test_util.h"

namespace {

using cleave::BpeModel;

// A vocabulary of the given tokens, each one's id its position.
std::unordered_map<std::string, uint32_t> vocab_of(const std::vector<std::string>& tokens) {
  std::unordered_map<std::string, uint32_t> v;
  for (size_t i = 0; i < tokens.size(); ++i) v.emplace(tokens[i], uint32_t(i));
  return v;
}

std::vector<uint32_t> encode(const BpeModel& m, const std::string& word) {
  std::vector<uint32_t> out;
  m.encode(word, out);
  return out;
}

using cleave::test_util::error_of;

//                                     0    1    2    3     4     5      6
const std::vector<std::string> kAbc = {"a", "b", "c", "ab", "bc", "abc", "aa"};

TEST(Bpe, LowestRankJoinsFirst) {
  // Which pair joins first decides the result: "abc" is a|bc when b c ranks first, ab|c otherwise.
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), {{"b", "c"}, {"a", "b"}}, false, "m"), "abc"),
            (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), {{"a", "b"}, {"b", "c"}}, false, "m"), "abc"),
            (std::vector<uint32_t>{3, 2}));
  // A join makes new pairs, which join in their turn.
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), {{"b", "c"}, {"a", "bc"}}, false, "m"), "abc"),
            (std::vector<uint32_t>{5}));
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), {}, false, "m"), "cab"),
            (std::vector<uint32_t>{2, 0, 1}));
}

TEST(Bpe, EqualRanksJoinLeftmostFirst) {
  const BpeModel m(vocab_of(kAbc), {{"a", "a"}}, false, "m");
  EXPECT_EQ(encode(m, "aaa"), (std::vector<uint32_t>{6, 0}));
  EXPECT_EQ(encode(m, "aaaa"), (std::vector<uint32_t>{6, 6}));
  EXPECT_EQ(encode(m, "aaaaa"), (std::vector<uint32_t>{6, 6, 0}));
}

TEST(Bpe, StaleCandidatesAreSkipped) {
  // "abab": a b joins at both places, then ab ab; the queued b a pair went stale when its b was
  // taken by the first join.
  const std::vector<std::string> tokens = {"a", "b", "ab", "abab", "ba"};
  const BpeModel m(vocab_of(tokens), {{"a", "b"}, {"b", "a"}, {"ab", "ab"}}, false, "m");
  EXPECT_EQ(encode(m, "abab"), (std::vector<uint32_t>{3}));
  EXPECT_EQ(encode(m, "bab"), (std::vector<uint32_t>{1, 2}));
}

TEST(Bpe, LaterDuplicateMergeKeepsItsRank) {
  // Hugging Face's merge map keeps the last rank a pair is listed with.
  const BpeModel m(vocab_of(kAbc), {{"a", "b"}, {"b", "c"}, {"a", "b"}}, false, "m");
  EXPECT_EQ(encode(m, "abc"), (std::vector<uint32_t>{0, 4}));
}

TEST(Bpe, IgnoreMergesTakesAWholeWordToken) {
  // "abc" is a token the merges cannot reach from a|b|c (b c first, and no a bc merge).
  const std::vector<BpeModel::Merge> merges = {{"b", "c"}};
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), merges, false, "m"), "abc"),
            (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), merges, true, "m"), "abc"),
            (std::vector<uint32_t>{5}));
  EXPECT_EQ(encode(BpeModel(vocab_of(kAbc), merges, true, "m"), "abca"),
            (std::vector<uint32_t>{0, 4, 0}));
}

TEST(Bpe, CharactersAreWholeUtf8Characters) {
  const std::vector<std::string> tokens = {"é", "t", "été", "ét"};
  const BpeModel m(vocab_of(tokens), {{"é", "t"}, {"ét", "é"}}, false, "m");
  EXPECT_EQ(encode(m, "été"), (std::vector<uint32_t>{2}));
  EXPECT_EQ(encode(m, "tét"), (std::vector<uint32_t>{1, 3}));
  const std::string msg = error_of([&] { encode(m, "x"); });
  EXPECT_NE(msg.find("\"x\" is not in the vocabulary"), std::string::npos) << msg;
}

TEST(Bpe, MergeOfUnknownTokensNamesIt) {
  std::string msg = error_of([&] { BpeModel(vocab_of(kAbc), {{"a", "b"}, {"c", "d"}}, false,
                                            "tokenizer.json x: model.merges"); });
  EXPECT_NE(msg.find("model.merges[1] (\"c\", \"d\"): \"d\" is not in the vocabulary"),
            std::string::npos)
      << msg;
  msg = error_of([&] { BpeModel(vocab_of(kAbc), {{"c", "a"}}, false, "model.merges"); });
  EXPECT_NE(msg.find("\"ca\" is not in the vocabulary"), std::string::npos) << msg;
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  std::string s;
  cleave::append_byte_level(" \nA~", s);
  EXPECT_EQ(s, "ĠĊA~");
  s.clear();
  cleave::append_byte_level("\xAD\xFF\x7F", s);  // the last of the 68 moved bytes is U+0143
  EXPECT_EQ(s, "\xC5\x83\xC3\xBF\xC4\xA1");       // Ń ÿ ġ
  // Every byte round-trips through its character; nothing else is a byte character.
  for (int b = 0; b < 256; ++b) {
    std::string c;
    cleave::append_byte_level(std::string(1, char(b)), c);
    const size_t n = cleave::utf8_char_length(c, 0);
    ASSERT_EQ(n, c.size()) << b;
    EXPECT_EQ(cleave::byte_level_byte(cleave::utf8_decode(c, 0, n)), b);
  }
  EXPECT_EQ(cleave::byte_level_byte(' '), -1);
  EXPECT_EQ(cleave::byte_level_byte(0x144), -1);
  EXPECT_EQ(cleave::byte_level_byte(0x4E2D), -1);
}

TEST(Utf8, InvalidBytesAreFound) {
  EXPECT_EQ(cleave::first_invalid_utf8("héllo 你好 🎉"), std::string::npos);
  EXPECT_EQ(cleave::first_invalid_utf8("ab\xC3"), 2u);           // cut off
  EXPECT_EQ(cleave::first_invalid_utf8("a\xC0\xAF"), 1u);        // overlong
  EXPECT_EQ(cleave::first_invalid_utf8("a\xED\xA0\x80"), 1u);    // a surrogate
  EXPECT_EQ(cleave::first_invalid_utf8("\xF4\x90\x80\x80"), 0u); // past U+10FFFF
  EXPECT_EQ(cleave::first_invalid_utf8("ok\x80"), 2u);           // a stray continuation
}

TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(cleave::utf8_lossy("héllo"), "héllo");
  EXPECT_EQ(cleave::utf8_lossy("a\xC3"), "a" + r);
  EXPECT_EQ(cleave::utf8_lossy("\xE2\x82x"), r + "x");           // one for the cut-off prefix
  EXPECT_EQ(cleave::utf8_lossy("\xF0\x9F\x8E"), r);               // an emoji's first 3 bytes
  EXPECT_EQ(cleave::utf8_lossy("\xC0\xAF"), r + r);               // neither byte starts one
  EXPECT_EQ(cleave::utf8_lossy("\xED\xA0\x80"), r + r + r);       // as the WHATWG decoder does
  EXPECT_EQ(cleave::utf8_lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(cleave::utf8_lossy("\xF0\x9F\x8E\x89!"), "🎉!");
}

std::vector<std::string> split(const cleave::TokenizerRegex& re, const std::string& text) {
  std::vector<std::string_view> views;
  re.split_isolated(text, views);
  return std::vector<std::string>(views.begin(), views.end());
}

const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kLlama3 =
    std::string(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)") +
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(TokenizerRegex, Gpt2PatternSplitsWordsNumbersAndSpaces) {
  const cleave::TokenizerRegex re(kGpt2, "gpt2");
  EXPECT_EQ(split(re, "Hello world's  12345 ok!\n\nné 你好"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " 12345", " ok", "!", "\n",
                                      "\n", "né", " 你好"}));
  // The lookahead leaves the last space of a run to the word after it.
  EXPECT_EQ(split(re, "a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(split(re, "x²³ Ⅻ"), (std::vector<std::string>{"x", "²³", " Ⅻ"}));  // No and Nl
}

TEST(TokenizerRegex, Llama3PatternFoldsCaseAndGroupsDigitsByThree) {
  const cleave::TokenizerRegex re(kLlama3, "llama3");
  EXPECT_EQ(split(re, "WE'LL pay 1234567"),
            (std::vector<std::string>{"WE", "'LL", " pay", " ", "123", "456", "7"}));
  EXPECT_EQ(split(re, "a\r\n\r\nb"), (std::vector<std::string>{"a", "\r\n\r\n", "b"}));
  // Oniguruma's case folding, as Hugging Face's tokenizers has it: the long s folds to s.
  EXPECT_EQ(split(re, "it'ſſ"), (std::vector<std::string>{"it", "'ſ", "ſ"}));
  // \s is Unicode's White_Space: U+3000 is one, U+200B (zero width space) is not.
  EXPECT_EQ(split(re, "a\u3000\u3000b"), (std::vector<std::string>{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(split(re, "a\u200Bb"), (std::vector<std::string>{"a", "\u200Bb"}));
}

TEST(TokenizerRegex, EmptyMatchesAndGapsAsTheTokenizersLibraryIteratesThem) {
  // An empty match cuts there; the text between matches is a piece of its own.
  EXPECT_EQ(split(cleave::TokenizerRegex("x*", "p"), "abxxc"),
            (std::vector<std::string>{"a", "b", "xx", "c"}));
  EXPECT_EQ(split(cleave::TokenizerRegex("[0-9]+", "p"), "ab12cd3"),
            (std::vector<std::string>{"ab", "12", "cd", "3"}));
  EXPECT_EQ(split(cleave::TokenizerRegex("q", "p"), "abc"), (std::vector<std::string>{"abc"}));
}

TEST(TokenizerRegex, BadPatternNamesWhere) {
  const std::string msg =
      error_of([] { cleave::TokenizerRegex("(?<x", "pre_tokenizer.pattern"); });
  EXPECT_NE(msg.find("pre_tokenizer.pattern: the pattern (?<x does not compile: "),
            std::string::npos)
      << msg;
}

}  // namespace
