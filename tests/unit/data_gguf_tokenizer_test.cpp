// A tokenizer as GGUF keys: a SentencePiece model's piece types and normalizer, read from the
// serialized proto; a byte-level tokenizer.json's merges, added tokens and holes; padding to the
// model's vocab_size; and the tokenizers llama.cpp would cut otherwise, refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cleave/base/check.h"
#include "cleave/data/bpe.h"
#include "cleave/data/gguf_tokenizer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using cleave::TokenizerVocabulary;

namespace {

using cleave::test_util::error_of;

bool holds(const cleave::gguf::Metadata& m, const std::string& s) {
  return m.bytes().find(s) != std::string::npos;
}

class GgufTokenizerTest : public ::testing::Test {
 protected:
  cleave::test_util::TestDir tmp_{"cleave-gguf-tokenizer"};
  const fs::path dir_ = tmp_.path();

  // 256 byte characters (id = byte), "Ġt" (256), a hole (257), "<|endoftext|>" (258, special;
  // listed in the vocabulary too, as GPT-2's file does, which is what leaves room for a hole),
  // "<x>" (259, not special).
  std::unique_ptr<cleave::Tokenizer> byte_level(const json& pre) {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) {
      std::string c;
      cleave::append_byte_level(std::string(1, char(b)), c);
      vocab[c] = b;
    }
    vocab["Ġt"] = 256;
    vocab["<|endoftext|>"] = 258;
    auto added = [](const char* text, int id, bool special) {
      return json{{"id", id}, {"content", text}, {"special", special}};
    };
    const json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"Ġ t"}},
                               {"ignore_merges", pre.contains("pretokenizers")}}},
                    {"added_tokens", {added("<|endoftext|>", 258, true), added("<x>", 259, false)}},
                    {"pre_tokenizer", pre},
                    {"decoder", {{"type", "ByteLevel"}}}};
    const fs::path d = dir_ / std::to_string(n_++);
    fs::create_directories(d);
    std::ofstream(d / "tokenizer.json") << j.dump();
    std::ofstream(d / "tokenizer_config.json") << json{{"eos_token", "<|endoftext|>"}}.dump();
    return cleave::open_tokenizer((d / "tokenizer.json").string());
  }
  int n_ = 0;
};

const json kGpt2Pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

TEST_F(GgufTokenizerTest, ByteLevelTypesMergesAndPadding) {
  const auto tok = byte_level(kGpt2Pre);
  const TokenizerVocabulary v = tok->vocabulary();
  ASSERT_EQ(v.pieces.size(), 260u);
  EXPECT_EQ(v.types[256], TokenizerVocabulary::normal);
  EXPECT_EQ(v.types[257], TokenizerVocabulary::unused);
  EXPECT_EQ(v.pieces[257], "");
  EXPECT_EQ(v.types[258], TokenizerVocabulary::control);
  EXPECT_EQ(v.types[259], TokenizerVocabulary::user_defined);
  EXPECT_EQ(v.merges, (std::vector<std::string>{"Ġ t"}));
  EXPECT_TRUE(v.scores.empty());

  cleave::gguf::Metadata m;
  cleave::add_gguf_tokenizer(m, *tok, 264);
  EXPECT_TRUE(m.has("tokenizer.ggml.merges"));
  EXPECT_FALSE(m.has("tokenizer.ggml.scores"));
  EXPECT_TRUE(m.has("tokenizer.ggml.eos_token_id"));
  EXPECT_FALSE(m.has("tokenizer.ggml.bos_token_id"));
  EXPECT_TRUE(holds(m, "gpt-2"));
  for (const char* pad : {"[PAD257]", "[PAD260]", "[PAD263]"}) EXPECT_TRUE(holds(m, pad)) << pad;
  EXPECT_FALSE(holds(m, "[PAD264]"));

  cleave::gguf::Metadata small;
  EXPECT_NE(error_of([&] { cleave::add_gguf_tokenizer(small, *tok, 259); })
                .find("has 260 tokens, more than the model's vocab_size 259"),
            std::string::npos);
}

TEST_F(GgufTokenizerTest, PreTokenizersLlamaCppNamesAndOthersRefused) {
  const json llama3 = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
                     R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  cleave::gguf::Metadata m;
  cleave::add_gguf_tokenizer(m, *byte_level(llama3), 260);
  EXPECT_TRUE(holds(m, "llama-bpe"));

  json other = llama3;
  other["pretokenizers"][0]["pattern"]["Regex"] = R"(\p{N}{1,3}|\s+)";
  cleave::gguf::Metadata m2;
  const auto tok = byte_level(other);
  EXPECT_NE(error_of([&] { cleave::add_gguf_tokenizer(m2, *tok, 260); })
                .find("is none of those llama.cpp names"),
            std::string::npos);
  json prefix = kGpt2Pre;
  prefix["add_prefix_space"] = true;
  const auto spaced = byte_level(prefix);
  EXPECT_NE(error_of([&] { cleave::add_gguf_tokenizer(m2, *spaced, 260); }).find("prefix space"),
            std::string::npos);
}

TEST_F(GgufTokenizerTest, SentencePiecePieceTypesFromTheModelFile) {
  std::string corpus;
  for (int i = 0; i < 400; ++i)
    corpus += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog\n\n";
  std::ofstream(dir_ / "corpus.txt") << corpus;
  cleave::train_tokenizer((dir_ / "corpus.txt").string(), (dir_ / "sp").string(), 320, 1);
  const auto tok = cleave::open_tokenizer((dir_ / "sp.model").string());
  const TokenizerVocabulary v = tok->vocabulary();
  ASSERT_EQ(int(v.pieces.size()), tok->vocab_size());
  EXPECT_EQ(v.types[0], TokenizerVocabulary::unknown);
  EXPECT_EQ(v.types[1], TokenizerVocabulary::control);  // <s>
  EXPECT_EQ(v.types[2], TokenizerVocabulary::control);  // </s>
  int user_defined = 0, bytes = 0;
  for (size_t id = 0; id < v.pieces.size(); ++id) {
    user_defined += v.types[id] == TokenizerVocabulary::user_defined;
    bytes += v.types[id] == TokenizerVocabulary::byte;
    if (v.pieces[id] == "\n") {
      EXPECT_EQ(v.types[id], TokenizerVocabulary::user_defined);
    }
  }
  EXPECT_EQ(user_defined, 1);  // the newline, cleave's one user-defined symbol
  EXPECT_EQ(bytes, 256);       // byte fallback
  EXPECT_EQ(v.spm_model_type, 2);
  EXPECT_EQ(v.spm_normalizer, "identity");
  EXPECT_FALSE(v.spm_dummy_prefix);
  EXPECT_FALSE(v.spm_remove_extra_whitespaces);

  cleave::gguf::Metadata m;
  cleave::add_gguf_tokenizer(m, *tok, 330);
  EXPECT_TRUE(m.has("tokenizer.ggml.scores"));
  EXPECT_TRUE(m.has("tokenizer.ggml.unknown_token_id"));
  EXPECT_TRUE(m.has("tokenizer.ggml.add_space_prefix"));
  EXPECT_FALSE(m.has("tokenizer.ggml.merges"));
  EXPECT_TRUE(holds(m, "[PAD329]"));
}

}  // namespace
