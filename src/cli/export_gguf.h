// cleave export CHECKPOINT OUT.gguf --format gguf: the model and its tokenizer as one GGUF file
// for llama.cpp (model/gguf_model.h, data/gguf_tokenizer.h).
#pragma once
#include <string>

#include "cleave/checkpoint/load_model.h"

namespace cleave::cli {

// `tokenizer` is the tokenizer file or folder to carry ("": none, an error); `dtype` is f32, f16
// or bf16, the type of the 2-D and 3-D weights.
void export_gguf(const LoadedModel& loaded, const std::string& out, const std::string& tokenizer,
                 const std::string& dtype);

}  // namespace cleave::cli
