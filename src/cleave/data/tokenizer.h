// Tokenizers: SentencePiece (a tokenizer.model: what `cleave tokenize` trains, and Llama 2's,
// Mistral's and Mixtral's) and Hugging Face's byte-level BPE (a tokenizer.json: GPT-2's, Llama
// 3's), behind one interface, opened from a path by open_tokenizer. SentencePiece training and
// corpus encoding are here too.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cleave {

// Trains a BPE model with `vocab_size` pieces on the text file `corpus` and writes
// `model_prefix`.model and `model_prefix`.vocab. Errors name the corpus and SentencePiece's reason.
void train_tokenizer(const std::string& corpus, const std::string& model_prefix, int vocab_size,
                     uint64_t seed);

// A tokenizer's vocabulary as its file holds it, and how text is cut before it: what another
// format's reader (GGUF's, data/gguf_tokenizer.h) needs to tokenize as this tokenizer does.
struct TokenizerVocabulary {
  // SentencePiece's piece types, in its numbering (which GGUF's token_type shares).
  enum Type : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };
  std::vector<std::string> pieces;  // by id: the file's text of each ("" where it has none)
  std::vector<Type> types;          // by id; unused where the file has no token
  // SentencePiece: each piece's score, its algorithm (1 unigram, 2 BPE, ...), its normalizer's
  // name and whitespace handling.
  std::vector<float> scores;
  int spm_model_type = 0;
  std::string spm_normalizer;
  bool spm_dummy_prefix = false, spm_remove_extra_whitespaces = false;
  // Byte-level BPE: the merges by rank ("left right"), the pre-tokenizer's Split patterns in
  // order, whether ByteLevel runs GPT-2's pattern and adds a prefix space, and ignore_merges.
  std::vector<std::string> merges;
  std::vector<std::string> split_patterns;
  bool byte_level_regex = false, prefix_space = false, ignore_merges = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text` as the tokenizer's own library gives them for one sequence with its special
  // tokens: encode_text(text) between the tokens the tokenizer puts around a sequence. For a
  // tokenizer.json, Hugging Face's tokenizer(text)["input_ids"] (add_special_tokens=True): Llama
  // 3's <|begin_of_text|> first, nothing around GPT-2's. For a tokenizer.model, SentencePiece's
  // encoding, with the BOS (EOS) first (last) when a tokenizer_config.json beside the model sets
  // add_bos_token (add_eos_token) to true, as Hugging Face's Llama 2 and Mistral folders do.
  std::vector<uint32_t> encode(std::string_view text) const;
  // The ids of the text alone (Hugging Face's add_special_tokens=False): for data preparation that
  // places its own separators. Special tokens written in the text (such as "<|endoftext|>") are
  // still read as the special tokens, as Hugging Face does by default. Text that is not valid
  // UTF-8 is an error.
  virtual std::vector<uint32_t> encode_text(std::string_view text) const = 0;
  // The text of the ids, special tokens written out; bytes that do not form UTF-8 (a character
  // cut between ids) become U+FFFD. An id outside the vocabulary is an error.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  // One more than the largest id (special tokens included).
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1: none
  virtual int eos_id() const = 0;  // -1: none
  // "SentencePiece" or "byte-level BPE", for messages.
  virtual const char* kind() const = 0;
  virtual TokenizerVocabulary vocabulary() const = 0;
  // The ids encode puts before and after encode_text's (a BOS first, an EOS last).
  const std::vector<uint32_t>& prefix_ids() const { return before_; }
  const std::vector<uint32_t>& suffix_ids() const { return after_; }

  const std::string& path() const { return path_; }  // the file it was read from
  // The chat_template of the tokenizer_config.json beside the tokenizer file ("" without one): a
  // Jinja template, kept for serving; a config holding named templates gives the one named
  // "default".
  const std::string& chat_template() const { return chat_template_; }

 protected:
  std::string path_, chat_template_;
  std::vector<uint32_t> before_, after_;  // put around encode_text's ids by encode
};

// Text as ids come, for printing while generating: each call gives what to show next. The whole
// sequence is decoded each time (pieces only join correctly in context); a character whose bytes
// are split over ids decodes as U+FFFD until its last byte comes, so a U+FFFD at the end is held
// back until the next id (finish() gives what is still held).
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string next(uint32_t id);
  std::string finish();

 private:
  std::string show(bool last);
  const Tokenizer& tokenizer_;
  std::vector<uint32_t> ids_;
  std::string shown_;
};

// Opens the tokenizer at `path`: a tokenizer.json (a file whose name ends in .json) is read as a
// Hugging Face byte-level BPE tokenizer, any other file as a SentencePiece model; a folder is
// looked into with find_tokenizer. Errors name the path and, for a tokenizer.json, the key at
// fault.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path);

// The tokenizer file a folder carries: its tokenizer.model if it has one, else its tokenizer.json,
// else "". A Hugging Face folder of a SentencePiece model (Llama 2, Mistral) holds both, its
// tokenizer.json being a conversion with byte fallback that open_tokenizer does not read.
std::string find_tokenizer(const std::string& dir);

// `cleave tokenize`: trains the tokenizer on `corpus`, encodes it, writes
// out_dir/{tokenizer.model, train.bin, val.bin}; the last val_fraction of documents (split on blank
// lines... see implementation) goes to validation. Prints what it wrote.
struct TokenizeReport { uint64_t train_tokens = 0, val_tokens = 0; };
TokenizeReport tokenize_corpus(const std::string& corpus, const std::string& out_dir, int vocab_size,
                               double val_fraction, uint64_t seed);

}  // namespace cleave
