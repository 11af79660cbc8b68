// A tokenizer as GGUF's tokenizer.ggml.* keys, so that llama.cpp tokenizes as cleave does: a
// SentencePiece BPE model as tokenizer.ggml.model "llama" (pieces, scores, types, its whitespace
// handling), a byte-level BPE tokenizer.json as "gpt2" (tokens, merges, types) with llama.cpp's
// name for its pre-tokenizer ("gpt-2" for GPT-2's pattern, "llama-bpe" for Llama 3's); the
// BOS / EOS / UNK ids, whether encode puts a BOS first or an EOS last, and the chat template.
// The model's vocab_size may exceed the tokenizer's (a padded embedding), but llama.cpp takes
// exactly one token per embedding row: the ids past the tokenizer's, and ids a tokenizer.json
// leaves without a token, are written as "[PAD<id>]", typed unused.
// What llama.cpp would tokenize otherwise is an error naming it: a unigram (or word, char)
// SentencePiece model, a normalizer, another pre-tokenizer, a prefix space in ByteLevel.
#pragma once
#include "cleave/base/gguf.h"
#include "cleave/data/tokenizer.h"

namespace cleave {

void add_gguf_tokenizer(gguf::Metadata& meta, const Tokenizer& tokenizer, int vocab_size);

}  // namespace cleave
