// What a SentencePiece model file says beyond what its library's API gives (Debian's
// libsentencepiece-dev ships no sentencepiece_model.pb.h): each piece's type, the algorithm, and
// how text is normalized before it is cut. Read from the serialized ModelProto by field number
// (sentencepiece_model.proto), skipping every other field.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace cleave {

struct SpmModelFacts {
  // ModelProto.SentencePiece.Type per piece: 1 normal, 2 unknown, 3 control, 4 user defined,
  // 5 unused, 6 byte (the proto's default, 1, where a piece states none).
  std::vector<int> piece_types;
  int model_type = 1;  // TrainerSpec.ModelType: 1 unigram, 2 BPE, 3 word, 4 char
  std::string normalizer;  // NormalizerSpec.name, e.g. "identity", "nmt_nfkc"
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

// Errors name `path` and what is malformed.
SpmModelFacts read_spm_model_facts(std::string_view proto, const std::string& path);

}  // namespace cleave
