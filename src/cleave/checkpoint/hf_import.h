// A Hugging Face folder into a cleave checkpoint (docs/checkpoints.md, "Hugging Face import"):
// config.json and model.safetensors, or the shards model.safetensors.index.json lists, with
// tensors in F32, BF16 or F16, in the layouts of model/hf_layout.h (the table export writes by).
// Everything is checked before anything is allocated: the config, then every tensor's name,
// shape and dtype in the files' headers against what the config makes of the table, so a
// config.json that asks for a huge model fails at its first tensor. The checkpoint holds the
// parameters in fp32, zero AdamW moments and step 0: a run starts from it with train.init_from.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cleave/checkpoint/safetensors.h"
#include "cleave/model/hf_layout.h"

namespace cleave {

// A tokenizer file import copies (Llama 3's tokenizer.json is 9 MB).
constexpr int64_t kMaxHfTokenizerBytes = int64_t(256) << 20;

class HfFolder {
 public:
  // Reads and checks `dir`; an error names the file and the key or tensor at fault.
  explicit HfFolder(const std::string& dir);

  const ModelConfig& model() const { return model_; }
  const std::string& model_type() const { return model_type_; }
  const std::vector<std::string>& files() const { return file_names_; }  // the weights' files
  const std::map<std::string, int>& dtypes() const { return dtypes_; }    // tensors by dtype
  int tensors() const { return int(sources_.size()); }
  // Tensors of the files that are buffers, not parameters (GPT-2's causal mask attn.bias,
  // Llama's rotary_emb.inv_freq), which import leaves behind.
  const std::vector<std::string>& ignored() const { return ignored_; }
  // The folder's tokenizer files (tokenizer.model, tokenizer.json, tokenizer_config.json, the
  // ones it has), which the checkpoint carries.
  const std::vector<std::string>& tokenizer_files() const { return tokenizer_files_; }

  // Writes the checkpoint folder `out` (atomically, as training does; out must not exist):
  // `config` is the resolved config as TOML whose [model] is model(), `seed` its train.seed.
  // The tokenizer files come along. Returns the number of parameters.
  int64_t write_checkpoint(const std::string& out, const std::string& config, uint64_t seed) const;

 private:
  struct Source {
    HfEntry entry;
    int file;         // into files_
    std::string key;  // its name in the file (GPT-2's without "transformer.", as OpenAI's are)
  };
  void open_weights();
  void read_f32(const Source& s, float* out) const;  // its hf_numel() elements, widened

  std::string dir_;
  ModelConfig model_;
  std::string model_type_;
  std::vector<SafetensorsFile> files_;
  std::vector<std::string> file_names_;
  std::map<std::string, int> file_of_;  // tensor name -> file
  std::vector<Source> sources_;
  std::map<std::string, int> dtypes_;
  std::vector<std::string> ignored_;
  std::vector<std::string> tokenizer_files_;
};

}  // namespace cleave
