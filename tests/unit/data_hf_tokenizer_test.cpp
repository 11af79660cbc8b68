// Reading a Hugging Face tokenizer.json: tiny byte-level vocabularies written by the test, each
// feature the reader follows (pre-tokenizer steps, added tokens, the template, the config beside
// it, decoding) and each it refuses, by the key the error names. The comparison with Hugging
// Face's own implementation on real vocabularies is integration/hf_tokenizer_test.sh.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/data/bpe.h"
#include "cleave/data/tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using cleave::test_util::error_of;

std::string byte_char(char b) {
  std::string s;
  cleave::append_byte_level(std::string(1, b), s);
  return s;
}

// A GPT-2-style tokenizer.json: the 256 byte characters (id = byte) and then `extra` tokens
// (ids 256, 257, ...), with `merges` in "left right" form over byte-level text.
json gpt2_style(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(char(b))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + i;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
            {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
            {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
}

json added(const std::string& content, int id, bool special = true, bool normalized = false) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", normalized}, {"special", special}};
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  // Writes j as dir/name/tokenizer.json (and `config` as its tokenizer_config.json) and opens it.
  std::unique_ptr<cleave::Tokenizer> open(const json& j, const std::string& name = "t",
                                          const json& config = nullptr) {
    return cleave::open_tokenizer(write(j, name, config));
  }
  std::string write(const json& j, const std::string& name, const json& config = nullptr) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    std::ofstream(d / "tokenizer.json") << j.dump();
    if (!config.is_null()) std::ofstream(d / "tokenizer_config.json") << config.dump();
    return (d / "tokenizer.json").string();
  }
  std::string error(const json& j) { return error_of([&] { open(j, "bad"); }); }

  cleave::test_util::TestDir tmp_{"cleave-hf-tokenizer"};
  const fs::path dir_ = tmp_.path();
};

using Ids = std::vector<uint32_t>;

TEST_F(HfTokenizerTest, Gpt2StyleEncodesPiecesOfThePattern) {
  // "Ġw" "Ġwo" "Ġwor" ... join "world" after its space; "he" "hel" ... join "hello".
  const auto tok = open(gpt2_style({"Ġw", "Ġwo", "he", "hel", "hell", "hello", "ĠĠ"},
                                   {"Ġ w", "Ġw o", "h e", "he l", "hel l", "hell o", "Ġ Ġ"}));
  EXPECT_EQ(tok->vocab_size(), 263);
  EXPECT_STREQ(tok->kind(), "byte-level BPE");
  // "hello" | " wo" "r" "l" "d" | "!" : the pattern cuts before the space, BPE joins within.
  EXPECT_EQ(tok->encode("hello world!"), (Ids{261, 257, 'r', 'l', 'd', '!'}));
  // Three spaces before a word: two on their own (one token), the last with the word.
  EXPECT_EQ(tok->encode("a   wo"), (Ids{'a', 262, 257}));
  EXPECT_EQ(tok->encode(""), Ids{});
  // Bytes of characters outside ASCII are byte characters: é is C3 A9.
  EXPECT_EQ(tok->encode("é"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("hello world! é 你好\n\t")), "hello world! é 你好\n\t");
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_EQ(tok->chat_template(), "");
}

TEST_F(HfTokenizerTest, AddPrefixSpaceStartsEveryStretchWithOne) {
  json j = gpt2_style({"Ġw", "Ġwo"}, {"Ġ w", "Ġw o"});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  j["added_tokens"] = {added("<s>", 258)};
  const auto tok = open(j);
  EXPECT_EQ(tok->encode("wo"), (Ids{257}));
  EXPECT_EQ(tok->encode(" wo"), (Ids{257}));  // already there
  // Each stretch between added tokens gets its own.
  EXPECT_EQ(tok->encode("wo<s>wo"), (Ids{257, 258, 257}));
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(open(j, "off")->encode("wo<s>wo"), (Ids{'w', 'o', 258, 'w', 'o'}));
}

TEST_F(HfTokenizerTest, Llama3StyleSplitThenByteLevelWithTemplateAndIgnoreMerges) {
  json j = gpt2_style({"ab", "abc", "bc", "Ġab"}, {"b c", "a b", "Ġ ab"});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"((?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["added_tokens"] = {added("<|begin_of_text|>", 260), added("<|eot_id|>", 261)};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|begin_of_text|>",
            {{"id", "<|begin_of_text|>"}, {"ids", {260}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  // Without ignore_merges "abc" is a|bc (b c ranks first); with it, the token "abc".
  const auto merged = open(j, "merged");
  EXPECT_EQ(merged->encode("abc"), (Ids{260, 'a', 258}));
  EXPECT_EQ(merged->encode_text("abc"), (Ids{'a', 258}));
  j["model"]["ignore_merges"] = true;
  const json config = {{"bos_token", "<|begin_of_text|>"},
                       {"eos_token", {{"content", "<|eot_id|>"}, {"__type", "AddedToken"}}},
                       {"chat_template", "{{ bos_token }}{% for m in messages %}{{ m }}"}};
  const auto tok = open(j, "llama", config);
  EXPECT_EQ(tok->encode("abc"), (Ids{260, 257}));
  // Digits by threes; the case-insensitive contraction; the template's token even before a
  // special token written in the text.
  EXPECT_EQ(tok->encode_text("1234 IT'S"),
            (Ids{'1', '2', '3', '4', ' ', 'I', 'T', '\'', 'S'}));
  EXPECT_EQ(tok->encode("<|eot_id|>abc"), (Ids{260, 261, 257}));
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_EQ(tok->bos_id(), 260);
  EXPECT_EQ(tok->eos_id(), 261);
  EXPECT_EQ(tok->chat_template(), config["chat_template"]);
  EXPECT_EQ(tok->decode(tok->encode("abc")), "<|begin_of_text|>abc");
}

TEST_F(HfTokenizerTest, AddedTokensLongestAtTheLeftmostPlaceInTwoPasses) {
  json j = gpt2_style({}, {});
  // "<a>" and "<a><b>" overlap: the longer wins where both start. "xy" is matched before
  // normalization, "wxy" after it (Hugging Face's order), so in "wxyz" it is "xy" that is read.
  j["added_tokens"] = {added("<a>", 256), added("<a><b>", 257), added("xy", 258, false, false),
                       added("wxy", 259, false, true)};
  const auto tok = open(j);
  EXPECT_EQ(tok->encode("<a><b><a>"), (Ids{257, 256}));
  EXPECT_EQ(tok->encode("q<a><c"), (Ids{'q', 256, '<', 'c'}));
  EXPECT_EQ(tok->encode("wxyz"), (Ids{'w', 258, 'z'}));
  EXPECT_EQ(tok->encode("wx"), (Ids{'w', 'x'}));
  EXPECT_EQ(tok->decode({257, 'q'}), "<a><b>q");
}

TEST_F(HfTokenizerTest, MergesAsPairsAndTokensThatAreNotBytesDecodeAsThemselves) {
  json j = gpt2_style({"ab"}, {});
  j["model"]["merges"] = json::array({json::array({"a", "b"})});  // tokenizers >= 0.20
  j["added_tokens"] = {added("<tab here>", 257, false)};  // its space is no byte character
  const auto tok = open(j);
  EXPECT_EQ(tok->encode("abab"), (Ids{256, 256}));
  EXPECT_EQ(tok->decode({256, 257, 256}), "ab<tab here>ab");
  // An id sequence ending inside a character decodes the cut character as U+FFFD.
  EXPECT_EQ(tok->decode({'a', 0xE4, 0xBD}), "a\xEF\xBF\xBD");
  const std::string msg = error_of([&] { tok->decode({'a', 258}); });
  EXPECT_NE(msg.find("id 258 at index 1 is no token"), std::string::npos) << msg;
  const std::string text_msg = error_of([&] { tok->encode("ok\xC3"); });
  EXPECT_NE(text_msg.find("not valid UTF-8 (at byte 2)"), std::string::npos) << text_msg;
}

TEST_F(HfTokenizerTest, DecodeStreamHoldsACutCharacterBackUntilItIsWhole) {
  const auto tok = open(gpt2_style({}, {}));
  cleave::DecodeStream stream(*tok);
  // "a你b": 你 is E4 BD A0, one byte per id.
  std::vector<std::string> shown;
  for (uint32_t id : Ids{'a', 0xE4, 0xBD, 0xA0, 'b'}) shown.push_back(stream.next(id));
  EXPECT_EQ(shown, (std::vector<std::string>{"a", "", "", "你", "b"}));
  EXPECT_EQ(stream.finish(), "");
  // Bytes that never form a character are shown as U+FFFD once the next byte says so, and a cut
  // character at the end by finish().
  cleave::DecodeStream bad(*tok);
  EXPECT_EQ(bad.next(0xC3), "");
  EXPECT_EQ(bad.next('x'), "\xEF\xBF\xBDx");
  EXPECT_EQ(bad.next(0xF0), "");
  EXPECT_EQ(bad.next(0x9F), "");
  EXPECT_EQ(bad.finish(), "\xEF\xBF\xBD");
}

TEST_F(HfTokenizerTest, UnsupportedFeaturesAreRefusedByKey) {
  const json base = gpt2_style({"ab"}, {"a b"});
  auto with = [&](const std::string& pointer, const json& value) {
    json j = base;
    j[json::json_pointer(pointer)] = value;
    return j;
  };
  const std::vector<std::pair<json, std::string>> cases = {
      {with("/model/type", "Unigram"), "model.type: \"Unigram\" is unsupported"},
      {with("/model/byte_fallback", true), "model.byte_fallback: is true"},
      {with("/model/dropout", 0.1), "model.dropout: is 0.1"},
      {with("/model/continuing_subword_prefix", "##"), "model.continuing_subword_prefix"},
      {with("/model/merges/0", "a b c"), "model.merges[0]: must be two tokens"},
      {with("/model/merges/0", "a q"),
       "model.merges[0] (\"a\", \"q\"): \"aq\" is not in the vocabulary"},
      {with("/model/vocab/ab", 5000), "model.vocab[\"ab\"]: must be an integer id from 0 to 256"},
      {with("/model/vocab/ab", 7), "model.vocab: id 7 is given to both"},
      {with("/normalizer", {{"type", "NFC"}}), "normalizer: is {\"type\":\"NFC\"}"},
      {with("/pre_tokenizer", {{"type", "Metaspace"}}),
       "pre_tokenizer.type: \"Metaspace\" is unsupported"},
      {with("/pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array()}}),
       "pre_tokenizer: has 0 ByteLevel steps"},
      {with("/pre_tokenizer", json::parse(R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed"}]})")),
       "pre_tokenizer.pretokenizers[0].behavior: \"Removed\" is unsupported"},
      {with("/pre_tokenizer", json::parse(R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"}]})")),
       "pre_tokenizer.pretokenizers[0].pattern: the pattern (a does not compile"},
      {with("/pre_tokenizer", json::parse(R"({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated"}]})")),
       "pre_tokenizer.pretokenizers[0].pattern: is {\"String\":\" \"}: unsupported"},
      {with("/pre_tokenizer/add_prefix_space", nullptr), "pre_tokenizer.add_prefix_space"},
      {with("/post_processor", {{"type", "RobertaProcessing"}}),
       "post_processor.type: \"RobertaProcessing\""},
      {with("/decoder", nullptr), "decoder: is missing"},
      {with("/decoder", {{"type", "Metaspace"}}), "decoder.type: \"Metaspace\" is unsupported"},
      {with("/truncation", {{"max_length", 512}}), "truncation: must be null"},
      {with("/added_tokens", json::array({added("<x>", 300)})),
       "added_tokens[0].id: must be an integer id"},
      {with("/added_tokens", json::array({added("<x>", 256)})),
       "added_tokens[0].id: 256 (\"<x>\") is already the id of \"ab\""},
      {with("/added_tokens", json::array({{{"id", 257}, {"content", "<x>"}, {"lstrip", true}}})),
       "added_tokens[0].lstrip: is true"},
  };
  for (const auto& [j, expected] : cases) {
    const std::string msg = error(j);
    EXPECT_NE(msg.find(expected), std::string::npos) << "expected: " << expected
                                                      << "\ngot: " << msg;
    EXPECT_NE(msg.find((dir_ / "bad" / "tokenizer.json").string()), std::string::npos) << msg;
  }
  // Missing byte characters: a vocabulary that is not byte-level.
  json j = base;
  j["model"]["vocab"].erase(byte_char('\n'));
  j["model"]["vocab"]["ab"] = '\n';
  EXPECT_NE(error(j).find("model.vocab: has no token for the byte 10 (\"Ċ\")"), std::string::npos)
      << error(j);
}

TEST_F(HfTokenizerTest, HostileFilesAreRefusedBeforeReading) {
  std::string msg = error_of([] { cleave::open_tokenizer("/dev/zero.json"); });
  EXPECT_NE(msg.find("/dev/zero.json"), std::string::npos) << msg;
  const fs::path fifo = dir_ / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  msg = error_of([&] { cleave::open_tokenizer(fifo.string()); });
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;
  std::ofstream(dir_ / "text.json") << "{\"model\": ";
  msg = error_of([&] { cleave::open_tokenizer((dir_ / "text.json").string()); });
  EXPECT_NE(msg.find("not JSON"), std::string::npos) << msg;
  // A config naming a token the tokenizer does not have.
  msg = error_of([&] { open(gpt2_style({}, {}), "eos", {{"eos_token", "</s>"}}); });
  EXPECT_NE(msg.find("tokenizer_config.json: eos_token \"</s>\" is not a token"),
            std::string::npos)
      << msg;
}

TEST_F(HfTokenizerTest, FolderLookupPrefersTheSentencePieceModel) {
  const std::string json_path = write(gpt2_style({}, {}), "folder");
  EXPECT_EQ(cleave::find_tokenizer((dir_ / "folder").string()), json_path);
  EXPECT_EQ(cleave::open_tokenizer((dir_ / "folder").string())->path(), json_path);
  std::ofstream(dir_ / "folder" / "tokenizer.model") << "x";
  EXPECT_EQ(cleave::find_tokenizer((dir_ / "folder").string()),
            (dir_ / "folder" / "tokenizer.model").string());
  EXPECT_EQ(cleave::find_tokenizer(dir_.string()), "");
}

TEST_F(HfTokenizerTest, SentencePieceTakesBosAndChatTemplateFromItsConfig) {
  const fs::path corpus = dir_ / "corpus.txt";
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the cat sat on mat number " + std::to_string(i) + "\n";
  std::ofstream(corpus) << text;
  fs::create_directories(dir_ / "sp");
  cleave::train_tokenizer(corpus.string(), (dir_ / "sp" / "tokenizer").string(), 300, 1);
  const std::string model = (dir_ / "sp" / "tokenizer.model").string();
  const auto plain = cleave::open_tokenizer(model);
  EXPECT_STREQ(plain->kind(), "SentencePiece");
  EXPECT_EQ(plain->encode("the cat"), plain->encode_text("the cat"));
  std::ofstream(dir_ / "sp" / "tokenizer_config.json")
      << json{{"add_bos_token", true}, {"chat_template", "[INST]"}}.dump();
  const auto with_bos = cleave::open_tokenizer(model);
  Ids expected = {uint32_t(with_bos->bos_id())};
  for (uint32_t id : plain->encode("the cat")) expected.push_back(id);
  EXPECT_EQ(with_bos->encode("the cat"), expected);
  EXPECT_EQ(with_bos->chat_template(), "[INST]");
}

}  // namespace
