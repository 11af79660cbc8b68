#include "cleave/data/gguf_tokenizer.h"

#include <unordered_map>

#include "cleave/base/check.h"

namespace cleave {

namespace {

// The Split patterns of the byte-level tokenizers llama.cpp has a pre-tokenizer for.
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* spm_algorithm(int model_type) {
  switch (model_type) {
    case 1: return "unigram";
    case 2: return "BPE";
    case 3: return "word";
    case 4: return "char";
  }
  return "unknown";
}

// llama.cpp's pre-tokenizer name for the byte-level tokenizer `v`, or an error naming `at`.
std::string pre_tokenizer(const TokenizerVocabulary& v, const std::string& at) {
  if (v.prefix_space)
    throw Error(at + ": its ByteLevel pre-tokenizer adds a prefix space, which llama.cpp's byte-"
                     "level BPE tokenizer does not; GGUF cannot carry it");
  // llama.cpp ignores merges for Llama 3's pre-tokenizer only: a word that is a token is taken
  // whole there, and merged from its characters under GPT-2's.
  if (v.split_patterns.empty() && v.byte_level_regex && !v.ignore_merges) return "gpt-2";
  if (v.split_patterns.size() == 1 && v.split_patterns[0] == kLlama3Pattern &&
      !v.byte_level_regex && v.ignore_merges)
    return "llama-bpe";
  std::string what = v.split_patterns.empty() ? "no Split pattern" : "Split patterns";
  for (const std::string& p : v.split_patterns) what += " '" + p + "'";
  throw Error(at + ": its pre-tokenizer (" + what + (v.byte_level_regex ? ", ByteLevel's GPT-2 "
              "pattern" : "") + (v.ignore_merges ? ", ignore_merges" : "") + ") is none of "
              "those llama.cpp names that cleave maps: GPT-2's (ByteLevel's pattern) and "
              "Llama 3's (one Split, ignore_merges); GGUF cannot say how to cut text for it");
}

}  // namespace

void add_gguf_tokenizer(gguf::Metadata& meta, const Tokenizer& tok, int vocab_size) {
  const std::string at = "tokenizer " + tok.path();
  TokenizerVocabulary v = tok.vocabulary();
  const int n = int(v.pieces.size());
  if (n > vocab_size)
    throw Error(at + " has " + std::to_string(n) + " tokens, more than the model's vocab_size " +
                std::to_string(vocab_size));
  const bool spm = v.spm_model_type != 0;
  std::string pre;
  if (spm) {
    if (v.spm_model_type != 2)
      throw Error(at + " is a SentencePiece " + spm_algorithm(v.spm_model_type) + " model; GGUF's "
                  "'llama' tokenizer merges pieces by score as SentencePiece's BPE does and would "
                  "cut text otherwise");
    if (v.spm_normalizer != "identity")
      throw Error(at + " normalizes text by '" + v.spm_normalizer + "', which llama.cpp does "
                  "not; GGUF can carry only SentencePiece models with the identity normalizer");
  } else {
    pre = pre_tokenizer(v, at);
  }
  for (int id = n; id < vocab_size; ++id) {
    v.pieces.emplace_back();
    v.types.push_back(TokenizerVocabulary::unused);
    if (spm) v.scores.push_back(0.0f);
  }
  std::unordered_map<std::string, int> seen;
  std::vector<int32_t> types(static_cast<size_t>(vocab_size));
  int unk = -1;
  for (int id = 0; id < vocab_size; ++id) {
    std::string& piece = v.pieces[size_t(id)];
    if (piece.empty()) piece = "[PAD" + std::to_string(id) + "]";
    const auto [it, fresh] = seen.emplace(piece, id);
    if (!fresh)
      throw Error(at + ": ids " + std::to_string(it->second) + " and " + std::to_string(id) +
                  " are both '" + piece + "', and llama.cpp requires each token once");
    types[size_t(id)] = v.types[size_t(id)];
    if (unk < 0 && v.types[size_t(id)] == TokenizerVocabulary::unknown) unk = id;
  }

  meta.add_string("tokenizer.ggml.model", spm ? "llama" : "gpt2");
  if (!spm) meta.add_string("tokenizer.ggml.pre", pre);
  meta.add_strings("tokenizer.ggml.tokens", v.pieces);
  if (spm) meta.add_f32s("tokenizer.ggml.scores", v.scores);
  meta.add_i32s("tokenizer.ggml.token_type", types);
  if (!spm) meta.add_strings("tokenizer.ggml.merges", v.merges);
  if (tok.bos_id() >= 0) meta.add_u32("tokenizer.ggml.bos_token_id", uint32_t(tok.bos_id()));
  if (tok.eos_id() >= 0) meta.add_u32("tokenizer.ggml.eos_token_id", uint32_t(tok.eos_id()));
  if (unk >= 0) meta.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(unk));
  // llama.cpp puts at most a BOS before a text and an EOS after it.
  auto single = [&](const std::vector<uint32_t>& ids, int id, const char* where, const char* name) {
    if (ids.empty()) return false;
    if (ids.size() == 1 && int(ids[0]) == id) return true;
    throw Error(at + " puts " + std::to_string(ids.size()) + " token(s) " + where +
                " a text, not its " + name + " alone, which llama.cpp cannot");
  };
  meta.add_bool("tokenizer.ggml.add_bos_token",
                single(tok.prefix_ids(), tok.bos_id(), "before", "BOS"));
  meta.add_bool("tokenizer.ggml.add_eos_token",
                single(tok.suffix_ids(), tok.eos_id(), "after", "EOS"));
  if (spm) {
    meta.add_bool("tokenizer.ggml.add_space_prefix", v.spm_dummy_prefix);
    meta.add_bool("tokenizer.ggml.remove_extra_whitespaces", v.spm_remove_extra_whitespaces);
  }
  if (!tok.chat_template().empty())
    meta.add_string("tokenizer.chat_template", tok.chat_template());
}

}  // namespace cleave
