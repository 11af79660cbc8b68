// The Hugging Face folder the hf_config and hf_index targets read: a tiny Llama's config.json
// (grouped-query attention, untied head), its tensors in BF16 over two shards with the index that
// lists them, and a folder, a FIFO and a link to /dev/zero under shard names. The fuzzed input
// replaces one file of it; HfFolder must refuse the folder naming it, or open it without hanging.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/safetensors.h"
#include "cleave/model/hf_config.h"
#include "cleave/model/hf_layout.h"
#include "fuzz_util.h"

namespace cleave::fuzz {

inline const char* tiny_llama_config() {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16,
  "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "max_position_embeddings": 8, "rms_norm_eps": 1e-5,
  "tie_word_embeddings": false})";
}

// Writes the folder once; returns its path.
inline const std::string& hf_folder() {
  static const std::string dir = [] {
    const std::string d = scratch() + "/hf";
    if (::mkdir(d.c_str(), 0755) != 0) finding("cannot create " + d);
    write_bytes(d + "/config.json", tiny_llama_config());
    const ModelConfig model =
        model_config_from_hf(nlohmann::json::parse(tiny_llama_config()), d + "/config.json");
    std::vector<std::vector<TensorView>> shards(2);
    std::vector<std::vector<uint16_t>> zeros;
    nlohmann::json weight_map = nlohmann::json::object();
    for (const HfEntry& e : hf_layout(model)) {
      const int shard = int(zeros.size() % 2);
      zeros.emplace_back(size_t(e.hf_numel()), uint16_t(0));
      shards[size_t(shard)].push_back(
          {e.hf, "BF16", e.hf_shape(), zeros.back().data(), uint64_t(e.hf_numel()) * 2});
      weight_map[e.hf] = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    }
    for (int s = 0; s < 2; ++s)
      write_safetensors(d + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors",
                        shards[size_t(s)], {{"format", "pt"}});
    write_bytes(d + "/model.safetensors.index.json",
                nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}
                    .dump());
    special_safetensors(d);
    return d;
  }();
  return dir;
}

}  // namespace cleave::fuzz
