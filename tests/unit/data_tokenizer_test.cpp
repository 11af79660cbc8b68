#include "cleave/data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/data/tokens.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A deterministic pseudo-English corpus: documents of a few lines, separated by blank lines
// (sometimes two, sometimes with stray spaces), with some punctuation, digits and UTF-8.
std::vector<std::string> make_documents(int n_docs) {
  static const char* syll[] = {"th", "e", "an", "re", "on", "at", "en", "nd", "ti", "es", "or",
                               "te", "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng",
                               "se", "ha", "as", "ou", "io", "le", "ve", "co", "me", "de", "hi"};
  static const char* punct[] = {",", ".", "!", "?", ";", ":", " -", "'s", "é", " 42", " ä½ å¥½"};
  uint64_t s = 0x9E3779B97F4A7C15ull;
  auto next = [&s](uint64_t n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (s >> 33) % n;
  };
  std::vector<std::string> docs;
  for (int d = 0; d < n_docs; ++d) {
    std::string doc;
    const int lines = 1 + int(next(4));
    for (int l = 0; l < lines; ++l) {
      if (l) doc += '\n';
      const int words = 3 + int(next(10));
      for (int w = 0; w < words; ++w) {
        if (w) doc += ' ';
        const int n_syll = 1 + int(next(3));
        for (int k = 0; k < n_syll; ++k) doc += syll[next(sizeof(syll) / sizeof(*syll))];
        if (next(6) == 0) doc += punct[next(sizeof(punct) / sizeof(*punct))];
      }
    }
    docs.push_back(doc);
  }
  return docs;
}

std::string join_documents(const std::vector<std::string>& docs) {
  std::string text;
  for (size_t i = 0; i < docs.size(); ++i) {
    text += docs[i];
    text += (i % 7 == 3) ? "\n\n  \n" : "\n\n";  // a whitespace-only line is blank too
  }
  return text;
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    docs_ = make_documents(1500);
    corpus_ = (dir_ / "corpus.txt").string();
    write_text(corpus_, join_documents(docs_));
  }

  cleave::test_util::TestDir tmp_{"cleave-data-tokenizer"};
  const fs::path dir_ = tmp_.path();
  std::vector<std::string> docs_;
  std::string corpus_;
};

using cleave::test_util::error_of;

}  // namespace

TEST_F(TokenizerTest, TrainEncodeDecodeRoundtrip) {
  const std::string prefix = (dir_ / "tok").string();
  cleave::train_tokenizer(corpus_, prefix, 512, 1);
  ASSERT_TRUE(fs::exists(prefix + ".model"));
  ASSERT_TRUE(fs::exists(prefix + ".vocab"));
  const auto tok = cleave::open_tokenizer(prefix + ".model");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);

  const std::string text = read_text(corpus_);
  const std::vector<uint32_t> ids = tok->encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // BPE merges compress the text
  for (uint32_t id : ids) ASSERT_LT(id, 512u);
  EXPECT_EQ(tok->decode(ids), text);

  // Text the tokenizer never saw roundtrips exactly through byte fallback; whitespace is kept.
  const std::string odd = "  Zebra\tquux\r\n\n日本語 ∑ 0123456789   trailing  ";
  EXPECT_EQ(tok->decode(tok->encode(odd)), odd);
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->decode({}), "");
}

TEST_F(TokenizerTest, TrainingIsDeterministic) {
  const std::string a = (dir_ / "a").string(), b = (dir_ / "b").string();
  cleave::train_tokenizer(corpus_, a, 600, 5);
  cleave::train_tokenizer(corpus_, b, 600, 5);
  EXPECT_EQ(read_text(a + ".model"), read_text(b + ".model"));
  EXPECT_EQ(read_text(a + ".vocab"), read_text(b + ".vocab"));
}

TEST_F(TokenizerTest, SmallVocabWithoutRoomForByteFallback) {
  // 256 pieces cannot hold the 256 byte pieces plus specials: trained without byte fallback,
  // characters of the corpus still roundtrip.
  const std::string prefix = (dir_ / "small").string();
  cleave::train_tokenizer(corpus_, prefix, 256, 1);
  const auto tok = cleave::open_tokenizer(prefix + ".model");
  EXPECT_EQ(tok->vocab_size(), 256);
  const std::string text = read_text(corpus_);
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST_F(TokenizerTest, VocabTooLargeForCorpusNamesCorpusAndSize) {
  const std::string tiny = (dir_ / "tiny.txt").string();
  write_text(tiny, "abc abd\n\nabc\n");
  const std::string msg =
      error_of([&] { cleave::train_tokenizer(tiny, (dir_ / "t").string(), 8192, 1); });
  EXPECT_NE(msg.find(tiny), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab size 8192"), std::string::npos) << msg;
}

TEST_F(TokenizerTest, MissingOrEmptyCorpus) {
  const std::string missing = (dir_ / "missing.txt").string();
  std::string msg = error_of([&] { cleave::train_tokenizer(missing, (dir_ / "t").string(), 512, 1); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;

  msg = error_of([&] { cleave::tokenize_corpus(missing, (dir_ / "out").string(), 512, 0.1, 1); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;

  const std::string empty = (dir_ / "empty.txt").string();
  write_text(empty, "\n \n\n");
  msg = error_of([&] { cleave::tokenize_corpus(empty, (dir_ / "out").string(), 512, 0.1, 1); });
  EXPECT_NE(msg.find(empty), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
}

TEST_F(TokenizerTest, SingleDocumentCorpusCannotBeSplit) {
  const std::string one = (dir_ / "one.txt").string();
  write_text(one, "just one document\nwith two lines\n");
  const std::string msg =
      error_of([&] { cleave::tokenize_corpus(one, (dir_ / "out").string(), 300, 0.1, 1); });
  EXPECT_NE(msg.find(one), std::string::npos) << msg;
  EXPECT_NE(msg.find("1 document"), std::string::npos) << msg;
}

TEST_F(TokenizerTest, MissingOrBadModelNamesPath) {
  const std::string missing = (dir_ / "nope.model").string();
  std::string msg = error_of([&] { const auto tok = cleave::open_tokenizer(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  // A folder is looked into; a device is named as such before SentencePiece would read it (for
  // ever).
  msg = error_of([&] { const auto tok = cleave::open_tokenizer(dir_.string()); });
  EXPECT_NE(msg.find(dir_.string() + " holds neither tokenizer.model nor tokenizer.json"),
            std::string::npos)
      << msg;
  msg = error_of([&] { const auto tok = cleave::open_tokenizer("/dev/zero"); });
  EXPECT_NE(msg.find("/dev/zero is not a regular file"), std::string::npos) << msg;

  const std::string garbage = (dir_ / "garbage.model").string();
  write_text(garbage, "this is not a sentencepiece model");
  msg = error_of([&] { const auto tok = cleave::open_tokenizer(garbage); });
  EXPECT_NE(msg.find(garbage), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot load"), std::string::npos) << msg;
}

TEST_F(TokenizerTest, DecodeRejectsOutOfRangeIds) {
  const std::string prefix = (dir_ / "tok").string();
  cleave::train_tokenizer(corpus_, prefix, 400, 1);
  const auto tok = cleave::open_tokenizer(prefix + ".model");
  const std::string msg = error_of([&] { tok->decode({5, 400}); });
  EXPECT_NE(msg.find("id 400 at index 1"), std::string::npos) << msg;
}

TEST_F(TokenizerTest, TokenizeCorpusWritesConsistentFiles) {
  const fs::path out = dir_ / "nested" / "out";  // created on demand
  const cleave::TokenizeReport rep = cleave::tokenize_corpus(corpus_, out.string(), 512, 0.1, 3);
  ASSERT_TRUE(fs::exists(out / "tokenizer.model"));
  ASSERT_TRUE(fs::exists(out / "train.bin"));
  ASSERT_TRUE(fs::exists(out / "val.bin"));
  for (const auto& e : fs::directory_iterator(out))  // no temporaries left over
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();

  const auto tok = cleave::open_tokenizer((out / "tokenizer.model").string());
  EXPECT_EQ(tok->vocab_size(), 512);
  const uint32_t vocab = uint32_t(tok->vocab_size());
  cleave::TokenShard train((out / "train.bin").string(), vocab);
  cleave::TokenShard val((out / "val.bin").string(), vocab);
  EXPECT_EQ(train.size(), rep.train_tokens);
  EXPECT_EQ(val.size(), rep.val_tokens);
  EXPECT_GT(rep.train_tokens, 8 * rep.val_tokens);

  // Splitting the shards at EOS gives back the documents, in order: the last 10% in val.
  const uint32_t eos = uint32_t(tok->eos_id());
  std::vector<std::string> decoded;
  for (const cleave::TokenShard* shard : {&train, &val}) {
    ASSERT_EQ(shard->tokens().back(), eos);
    std::vector<uint32_t> cur;
    for (uint32_t t : shard->tokens()) {
      if (t == eos) {
        decoded.push_back(tok->decode(cur));
        cur.clear();
      } else {
        cur.push_back(t);
      }
    }
  }
  ASSERT_EQ(decoded.size(), docs_.size());
  for (size_t i = 0; i < docs_.size(); ++i) ASSERT_EQ(decoded[i], docs_[i]) << "document " << i;
  size_t val_docs = 0;
  for (uint32_t t : val.tokens()) val_docs += t == eos;
  EXPECT_EQ(val_docs, 150u);

  // Same inputs, same outputs.
  const fs::path out2 = dir_ / "out2";
  cleave::tokenize_corpus(corpus_, out2.string(), 512, 0.1, 3);
  EXPECT_EQ(read_text(out / "train.bin"), read_text(out2 / "train.bin"));
  EXPECT_EQ(read_text(out / "val.bin"), read_text(out2 / "val.bin"));
  EXPECT_EQ(read_text(out / "tokenizer.model"), read_text(out2 / "tokenizer.model"));
}

TEST_F(TokenizerTest, ValidationGetsAtLeastOneDocument) {
  const fs::path out = dir_ / "out";
  const auto rep = cleave::tokenize_corpus(corpus_, out.string(), 400, 0.0, 1);
  EXPECT_GT(rep.val_tokens, 0u);
  const auto tok = cleave::open_tokenizer((out / "tokenizer.model").string());
  cleave::TokenShard val((out / "val.bin").string(), uint32_t(tok->vocab_size()));
  EXPECT_EQ(tok->decode(std::vector<uint32_t>(val.tokens().begin(), val.tokens().end() - 1)),
            docs_.back());
}

TEST(TokenizerShakespeare, TokenizeTinyShakespeare) {
  // ../shared beside the checkout, as CI lays it out.
  const fs::path corpus = fs::path(CLEAVE_SOURCE_DIR) / ".." / "shared" / "data" / "tinyshakespeare.txt";
  if (!fs::exists(corpus)) GTEST_SKIP() << corpus << " is not available";
  const cleave::test_util::TestDir tmp("cleave-data-shakespeare");
  const fs::path out = tmp.path() / "out";
  const auto rep = cleave::tokenize_corpus(corpus.string(), out.string(), 1024, 0.1, 1337);
  const uint64_t total = rep.train_tokens + rep.val_tokens;
  const double bytes_per_token = double(fs::file_size(corpus)) / double(total);
  EXPECT_GT(bytes_per_token, 2.0);
  EXPECT_GT(rep.val_tokens, total / 20);
  EXPECT_LT(rep.val_tokens, total / 5);
  cleave::TokenShard train((out / "train.bin").string(), 1024);
  cleave::TokenShard val((out / "val.bin").string(), 1024);
  EXPECT_EQ(train.size() + val.size(), total);
}
