// SentencePiece BPE: training a tokenizer model on a corpus, encoding and decoding.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece { class SentencePieceProcessor; }

namespace cleave {

// Trains a BPE model with `vocab_size` pieces on the text file `corpus` and writes
// `model_prefix`.model and `model_prefix`.vocab. Errors name the corpus and SentencePiece's reason.
void train_tokenizer(const std::string& corpus, const std::string& model_prefix, int vocab_size,
                     uint64_t seed);

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);  // error names the path when it fails
  ~Tokenizer();
  std::vector<uint32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<uint32_t>& ids) const;
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// `cleave tokenize`: trains the tokenizer on `corpus`, encodes it, writes
// out_dir/{tokenizer.model, train.bin, val.bin}; the last val_fraction of documents (split on blank
// lines... see implementation) goes to validation. Prints what it wrote.
struct TokenizeReport { uint64_t train_tokens = 0, val_tokens = 0; };
TokenizeReport tokenize_corpus(const std::string& corpus, const std::string& out_dir, int vocab_size,
                               double val_fraction, uint64_t seed);

}  // namespace cleave
