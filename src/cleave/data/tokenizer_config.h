// tokenizer_config.json, the file Hugging Face's transformers keeps beside a tokenizer: what a
// tokenizer file alone does not say (which token ends a text, whether SentencePiece models put a
// BOS first, the chat template).
#pragma once
#include <optional>
#include <string>

namespace cleave {

struct TokenizerConfig {
  std::string path;  // "" when the folder has no tokenizer_config.json
  std::string chat_template;
  std::optional<std::string> bos_token, eos_token;  // the tokens' text
  bool add_bos_token = false, add_eos_token = false;
};

// Reads the tokenizer_config.json in the folder of `tokenizer_path`, if there is one. Only the
// keys above are read; a present key of the wrong type is an error naming the file and the key.
TokenizerConfig read_tokenizer_config(const std::string& tokenizer_path);

}  // namespace cleave
