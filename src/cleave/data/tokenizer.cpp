#include "cleave/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/data/hf_tokenizer.h"
#include "cleave/data/spm_model_proto.h"
#include "cleave/data/tokenizer_config.h"
#include "cleave/data/tokens.h"

namespace cleave {

namespace {

constexpr int64_t kMaxTokenizerBytes = 1024 * kMiB;

namespace fs = std::filesystem;
namespace spm = sentencepiece;

// Reads a whole text file; errors name the path (missing, unreadable, empty).
std::string read_corpus(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) CLEAVE_FAIL("corpus " << path << ": no such file");
  if (fs::is_directory(path, ec)) CLEAVE_FAIL("corpus " << path << ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) CLEAVE_FAIL("corpus " << path << ": cannot open: " << std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) CLEAVE_FAIL("corpus " << path << ": read error");
  std::string text = std::move(ss).str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    CLEAVE_FAIL("corpus " << path << ": is empty (no text to train or encode)");
  return text;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Documents are maximal runs of non-blank lines (blank = empty or only spaces, tabs, '\r').
// Each document is the text from its first line's start to its last line's end, without the
// final newline; interior newlines are kept.
std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  size_t pos = 0, doc_begin = std::string_view::npos, doc_end = 0;
  while (true) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    if (is_blank(text.substr(pos, nl - pos))) {
      if (doc_begin != std::string_view::npos) {
        docs.push_back(text.substr(doc_begin, doc_end - doc_begin));
        doc_begin = std::string_view::npos;
      }
    } else {
      if (doc_begin == std::string_view::npos) doc_begin = pos;
      doc_end = nl;
    }
    if (nl >= text.size()) break;
    pos = nl + 1;
  }
  if (doc_begin != std::string_view::npos)
    docs.push_back(text.substr(doc_begin, doc_end - doc_begin));
  return docs;
}

// Training sentences: the non-blank lines of the given texts, in order.
std::vector<std::string_view> training_lines(const std::vector<std::string_view>& texts) {
  std::vector<std::string_view> lines;
  for (std::string_view t : texts) {
    size_t pos = 0;
    while (pos <= t.size()) {
      size_t nl = t.find('\n', pos);
      if (nl == std::string_view::npos) nl = t.size();
      const std::string_view line = t.substr(pos, nl - pos);
      if (!is_blank(line)) lines.push_back(line);
      pos = nl + 1;
    }
  }
  return lines;
}

class LineIterator : public spm::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string_view>& lines) : lines_(lines) { load(); }
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return cur_; }
  spm::util::Status status() const override { return spm::util::Status(); }

 private:
  void load() {
    if (i_ < lines_.size()) cur_.assign(lines_[i_]);
  }
  const std::vector<std::string_view>& lines_;
  size_t i_ = 0;
  std::string cur_;
};

// SentencePiece keeps its seed and log level in globals: one training at a time.
std::mutex& training_mutex() {
  static std::mutex m;
  return m;
}

// Trains a BPE model on `lines` and returns the serialized ModelProto. `corpus` names the text in
// errors. Byte fallback (256 <0xXX> pieces, so any text encodes losslessly) is used when the
// vocabulary has room for it; otherwise training is retried without it at character coverage 1.0.
std::string train_bpe(const std::vector<std::string_view>& lines, const std::string& corpus,
                      int vocab_size, uint64_t seed) {
  CLEAVE_CHECK(vocab_size > 0, "cannot train a tokenizer on " << corpus << " with vocab size "
                                                              << vocab_size);
  CLEAVE_CHECK(!lines.empty(), "cannot train a tokenizer on " << corpus << " with vocab size "
                                                              << vocab_size << ": no text");
  std::lock_guard<std::mutex> lock(training_mutex());
  auto attempt = [&](bool byte_fallback, std::string* model) {
    const std::unordered_map<std::string, std::string> args = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(vocab_size)},
        {"byte_fallback", byte_fallback ? "true" : "false"},
        {"character_coverage", byte_fallback ? "0.9995" : "1.0"},
        // Lossless text: no normalisation, whitespace kept as is, no dummy leading space (lines
        // after a newline start without one too), newline as its own piece.
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"add_dummy_prefix", "false"},
        {"user_defined_symbols", "\n"},
        {"split_digits", "true"},
        {"allow_whitespace_only_pieces", "true"},
        // Fixed ids: unk 0, bos 1, eos 2, no pad.
        {"unk_id", "0"},
        {"bos_id", "1"},
        {"eos_id", "2"},
        {"pad_id", "-1"},
        // Deterministic and quiet; small corpora are used whole.
        {"num_threads", "1"},
        {"input_sentence_size", "10000000"},
        {"shuffle_input_sentence", "true"},
        {"max_sentence_length", "1048576"},
        {"hard_vocab_limit", "true"},
        {"minloglevel", "2"},
    };
    spm::SetRandomGeneratorSeed(uint32_t(seed ^ (seed >> 32)));
    LineIterator it(lines);
    return spm::SentencePieceTrainer::Train(args, &it, model);
  };
  std::string model;
  auto st = attempt(true, &model);
  if (!st.ok() && std::string_view(st.message()).find("required_chars") != std::string_view::npos) {
    model.clear();
    const auto st2 = attempt(false, &model);
    if (!st2.ok())
      CLEAVE_FAIL("cannot train a tokenizer on " << corpus << " with vocab size " << vocab_size
                                                 << ": " << st2.message()
                                                 << " (with byte fallback: " << st.message()
                                                 << ")");
    st = st2;
  }
  if (!st.ok())
    CLEAVE_FAIL("cannot train a tokenizer on " << corpus << " with vocab size " << vocab_size
                                               << ": " << st.message());
  return model;
}

void load_serialized(spm::SentencePieceProcessor& sp, const std::string& model,
                     const std::string& corpus) {
  const auto st = sp.LoadFromSerializedProto(model);
  if (!st.ok())
    CLEAVE_FAIL("tokenizer trained on " << corpus << " does not load: " << st.message());
}

}  // namespace

void train_tokenizer(const std::string& corpus, const std::string& model_prefix, int vocab_size,
                     uint64_t seed) {
  const std::string text = read_corpus(corpus);
  const std::vector<std::string_view> texts = {text};
  const std::string model = train_bpe(training_lines(texts), corpus, vocab_size, seed);
  spm::SentencePieceProcessor sp;
  load_serialized(sp, model, corpus);
  std::ostringstream vocab;
  for (int id = 0; id < sp.GetPieceSize(); ++id) {  // one piece a line: escape control chars
    for (char c : sp.IdToPiece(id)) {
      if (c == '\n') vocab << "\\n";
      else if (c == '\t') vocab << "\\t";
      else if (c == '\r') vocab << "\\r";
      else vocab << c;
    }
    vocab << '\t' << sp.GetScore(id) << '\n';
  }
  write_file_atomic(model_prefix + ".model", model, "tokenizer model");
  write_file_atomic(model_prefix + ".vocab", vocab.str(), "tokenizer vocabulary");
}

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path) {
    path_ = model_path;
    // SentencePiece would read a FIFO or /dev/zero for ever: a model is a regular file of at most
    // a few tens of MB (Llama 2's is 0.5 MB).
    check_bounded_file(model_path, "tokenizer model", kMaxTokenizerBytes);
    const auto st = sp_.Load(model_path);
    if (!st.ok())
      CLEAVE_FAIL("tokenizer model " << model_path << ": cannot load: " << st.message());
    const TokenizerConfig config = read_tokenizer_config(model_path);
    chat_template_ = config.chat_template;
    auto special = [&](bool wanted, int id, const char* key, std::vector<uint32_t>& into) {
      if (!wanted) return;
      if (id < 0) CLEAVE_FAIL(config.path << ": " << key << " is true but " << model_path
                                          << " has no such token");
      into.push_back(uint32_t(id));
    };
    special(config.add_bos_token, sp_.bos_id(), "add_bos_token", before_);
    special(config.add_eos_token, sp_.eos_id(), "add_eos_token", after_);
  }

  std::vector<uint32_t> encode_text(std::string_view text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok()) CLEAVE_FAIL("tokenizer " << path_ << ": cannot encode text: " << st.message());
    return std::vector<uint32_t>(ids.begin(), ids.end());
  }

  std::string decode(const std::vector<uint32_t>& ids) const override {
    const uint32_t n = uint32_t(sp_.GetPieceSize());
    std::vector<int> v(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= n)
        CLEAVE_FAIL("tokenizer " << path_ << ": id " << ids[i] << " at index " << i
                                 << " is >= vocab size " << n);
      v[i] = int(ids[i]);
    }
    std::string text;
    const auto st = sp_.Decode(v, &text);
    if (!st.ok()) CLEAVE_FAIL("tokenizer " << path_ << ": cannot decode ids: " << st.message());
    return text;
  }

  int vocab_size() const override { return sp_.GetPieceSize(); }
  int bos_id() const override { return sp_.bos_id(); }
  int eos_id() const override { return sp_.eos_id(); }
  const char* kind() const override { return "SentencePiece"; }

  TokenizerVocabulary vocabulary() const override {
    const SpmModelFacts facts = read_spm_model_facts(sp_.serialized_model_proto(), path_);
    const int n = sp_.GetPieceSize();
    CLEAVE_CHECK(int(facts.piece_types.size()) == n,
                 "tokenizer model " << path_ << ": lists " << facts.piece_types.size()
                                    << " pieces, SentencePiece loaded " << n);
    TokenizerVocabulary v;
    for (int id = 0; id < n; ++id) {
      v.pieces.push_back(sp_.IdToPiece(id));
      v.scores.push_back(sp_.GetScore(id));
      const int t = facts.piece_types[size_t(id)];
      CLEAVE_CHECK(t >= TokenizerVocabulary::normal && t <= TokenizerVocabulary::byte,
                   "tokenizer model " << path_ << ": piece " << id << " has unknown type " << t);
      v.types.push_back(TokenizerVocabulary::Type(t));
    }
    v.spm_model_type = facts.model_type;
    v.spm_normalizer = facts.normalizer;
    v.spm_dummy_prefix = facts.add_dummy_prefix;
    v.spm_remove_extra_whitespaces = facts.remove_extra_whitespaces;
    return v;
  }

 private:
  spm::SentencePieceProcessor sp_;
};

}  // namespace

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids = before_;
  const std::vector<uint32_t> body = encode_text(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), after_.begin(), after_.end());
  return ids;
}

std::string DecodeStream::next(uint32_t id) {
  ids_.push_back(id);
  return show(false);
}

std::string DecodeStream::finish() { return show(true); }

std::string DecodeStream::show(bool last) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  std::string text = tokenizer_.decode(ids_);
  while (!last && text.size() >= kReplacement.size() &&
         text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
    text.resize(text.size() - kReplacement.size());
  // Text that changed before its end (a tokenizer may rewrite it in context) is not shown again.
  std::string out;
  if (text.size() > shown_.size() && text.compare(0, shown_.size(), shown_) == 0)
    out = text.substr(shown_.size());
  shown_ = std::move(text);
  return out;
}

std::string find_tokenizer(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p, ec)) return p.string();
  }
  return "";
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    file = find_tokenizer(path);
    if (file.empty())
      CLEAVE_FAIL("tokenizer folder " << path << " holds neither tokenizer.model nor "
                                         "tokenizer.json");
  }
  if (fs::path(file).extension() == ".json") return std::make_unique<HfTokenizer>(file);
  return std::make_unique<SentencePieceTokenizer>(file);
}

TokenizeReport tokenize_corpus(const std::string& corpus, const std::string& out_dir,
                               int vocab_size, double val_fraction, uint64_t seed) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  CLEAVE_CHECK(val_fraction >= 0.0 && val_fraction < 1.0,
               "val_fraction=" << val_fraction << " must be in [0, 1)");
  const std::string text = read_corpus(corpus);
  const std::vector<std::string_view> docs = split_documents(text);
  if (docs.size() < 2)
    CLEAVE_FAIL("corpus " << corpus << ": has " << docs.size()
                          << " document(s); need at least 2 (documents are separated by blank "
                             "lines) to split train and validation");
  const size_t n_docs = docs.size();
  const size_t n_val = std::clamp<size_t>(size_t(std::llround(val_fraction * double(n_docs))), 1,
                                          n_docs - 1);
  const size_t n_train = n_docs - n_val;

  // The tokenizer sees only the training documents, so validation text stays unseen.
  const std::vector<std::string_view> train_docs(docs.begin(), docs.begin() + ptrdiff_t(n_train));
  const std::string model = train_bpe(training_lines(train_docs), corpus, vocab_size, seed);
  spm::SentencePieceProcessor sp;
  load_serialized(sp, model, corpus);
  const auto t1 = clock::now();

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    CLEAVE_FAIL("output directory " << out_dir << ": cannot create: "
                                    << (ec ? ec.message() : std::string("not a directory")));
  const std::string model_path = (fs::path(out_dir) / "tokenizer.model").string();
  write_file_atomic(model_path, model, "tokenizer model");

  // Encode documents in parallel, in chunks to bound memory; concatenate in document order with
  // an EOS after each document.
  const uint32_t eos = uint32_t(sp.eos_id());
  std::vector<uint32_t> train_tokens, val_tokens;
  train_tokens.reserve(text.size() / 3);
  constexpr size_t kChunk = 8192;
  std::vector<std::vector<int>> encoded(std::min(kChunk, n_docs));
  for (size_t start = 0; start < n_docs; start += kChunk) {
    const int64_t n = int64_t(std::min(kChunk, n_docs - start));
    std::atomic<bool> failed{false};
    std::string failure;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t j = 0; j < n; ++j) {
      encoded[size_t(j)].clear();
      const auto st = sp.Encode(docs[start + size_t(j)], &encoded[size_t(j)]);
      if (!st.ok() && !failed.exchange(true)) failure = st.message();
    }
    if (failed)
      CLEAVE_FAIL("corpus " << corpus << ": encoding failed: " << failure);
    for (int64_t j = 0; j < n; ++j) {
      auto& dst = start + size_t(j) < n_train ? train_tokens : val_tokens;
      dst.insert(dst.end(), encoded[size_t(j)].begin(), encoded[size_t(j)].end());
      dst.push_back(eos);
    }
  }
  const auto t2 = clock::now();

  const uint32_t vocab = uint32_t(sp.GetPieceSize());
  const std::string train_path = (fs::path(out_dir) / "train.bin").string();
  const std::string val_path = (fs::path(out_dir) / "val.bin").string();
  write_token_shard(train_path, train_tokens, vocab);
  write_token_shard(val_path, val_tokens, vocab);
  const auto t3 = clock::now();

  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::ostringstream msg;
  msg.setf(std::ios::fixed);
  msg.precision(2);
  msg << "tokenize: " << corpus << " (" << text.size() << " bytes, " << n_docs << " documents)\n"
      << "  " << model_path << ": BPE, vocab " << vocab << " (trained in " << secs(t0, t1)
      << " s)\n"
      << "  " << train_path << ": " << train_tokens.size() << " tokens, " << n_train
      << " documents\n"
      << "  " << val_path << ": " << val_tokens.size() << " tokens, " << n_val << " documents\n"
      << "  encoded in " << secs(t1, t2) << " s, written in " << secs(t2, t3) << " s; "
      << double(text.size()) / double(train_tokens.size() + val_tokens.size())
      << " bytes/token\n";
  std::cout << msg.str() << std::flush;

  TokenizeReport report;
  report.train_tokens = train_tokens.size();
  report.val_tokens = val_tokens.size();
  return report;
}

}  // namespace cleave
