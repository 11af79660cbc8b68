// tokenize_lines TOKENIZER TEXTS.jsonl OUT.jsonl [--roundtrip]
//
// Encodes texts with cleave's tokenizer for a comparison with another implementation
// (integration/hf_tokenizer_test.sh holds it against transformers.js). TEXTS.jsonl has one JSON
// string a line; OUT.jsonl gets, for each, the JSON list
//   [encode(text), encode_text(text), decode(encode(text))]
// (the ids with the tokenizer's template, without it, and the text of the first). --roundtrip
// checks decode(encode_text(text)) == text on every text and exits 1, naming the first texts that
// differ, when one does not come back (a tokenizer that adds a prefix space gives it back too).
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cleave/data/tokenizer.h"

int main(int argc, char** argv) {
  const bool roundtrip = argc == 5 && std::string(argv[4]) == "--roundtrip";
  if (argc != 4 && !roundtrip) {
    std::fprintf(stderr, "usage: tokenize_lines TOKENIZER TEXTS.jsonl OUT.jsonl [--roundtrip]\n");
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const auto tok = cleave::open_tokenizer(argv[1]);
    const auto t1 = std::chrono::steady_clock::now();
    std::ifstream in(argv[2]);
    std::ofstream out(argv[3]);
    if (!in || !out)
      throw std::runtime_error(std::string("cannot open ") + argv[2] + " or " + argv[3]);
    std::string line;
    size_t texts = 0, tokens = 0, lost = 0;
    while (std::getline(in, line)) {
      const std::string text = nlohmann::json::parse(line).get<std::string>();
      const std::vector<uint32_t> ids = tok->encode(text), plain = tok->encode_text(text);
      const std::string back = tok->decode(plain);
      if (roundtrip && back != text && ++lost <= 5)
        std::fprintf(stderr, "decode(encode(text)) differs for text %zu: %s -> %s\n", texts,
                     nlohmann::json(text).dump().c_str(), nlohmann::json(back).dump().c_str());
      out << nlohmann::json::array({ids, plain, tok->decode(ids)}).dump() << '\n';
      ++texts;
      tokens += plain.size();
    }
    const auto t2 = std::chrono::steady_clock::now();
    const auto ms = [](auto a, auto b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    std::printf("%s: %s, vocabulary %d, bos %d, eos %d, chat template of %zu characters; read in "
                "%.0f ms; %zu texts, %zu tokens in %.0f ms%s\n",
                tok->path().c_str(), tok->kind(), tok->vocab_size(), tok->bos_id(), tok->eos_id(),
                tok->chat_template().size(), ms(t0, t1), texts, tokens, ms(t1, t2),
                roundtrip ? ("; " + std::to_string(lost) + " did not decode back").c_str() : "");
    return lost ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_lines: %s\n", e.what());
    return 1;
  }
}
