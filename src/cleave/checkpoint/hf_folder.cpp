// HfFolder's reading and checking of a Hugging Face folder (hf_import.h); its writing of the
// checkpoint is in hf_import.cpp.
#include "cleave/checkpoint/hf_import.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/model/hf_config.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

// config.json and the index are kilobytes (a large model's index: about 100 KB).
constexpr int64_t kMaxJsonBytes = 64 * kMiB;

nlohmann::json read_json(const std::string& path, const char* what) {
  const std::string text = read_bounded_file(path, what, kMaxJsonBytes);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + " is not JSON: " + e.what());
  }
}

// A shard's name as the index gives it must be a file of the folder, not a path out of it.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Buffers some checkpoints keep beside the parameters, which no model reads from a file: GPT-2's
// causal mask (attn.bias, and attn.masked_bias in older files) and Llama's rotary frequencies.
bool is_buffer(Family family, const std::string& name) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return family == Family::gpt2 ? ends_with(".attn.bias") || ends_with(".attn.masked_bias")
                                : ends_with(".rotary_emb.inv_freq");
}

}  // namespace

HfFolder::HfFolder(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec))
    throw Error("Hugging Face folder " + dir_ +
                (fs::exists(dir_, ec) ? " is not a folder" : " does not exist"));
  const std::string config_path = dir_ + "/config.json";
  const nlohmann::json config = read_json(config_path, "Hugging Face config");
  model_ = model_config_from_hf(config, config_path);
  model_type_ = config["model_type"].get<std::string>();
  open_weights();

  // Every tensor of the table in the files, with its shape and a dtype import reads: checked in
  // the headers before anything is allocated.
  const std::string base = model_.family == Family::gpt2 ? "transformer." : "model.";
  std::set<std::string> used;
  visit_hf_layout(model_, [&](const HfEntry& e) {
    std::string key = e.hf;
    // A checkpoint of the base model without its head (OpenAI's GPT-2) names the same tensors
    // without the base model's prefix.
    const bool prefixed = key.rfind(base, 0) == 0;
    if (!file_of_.count(key) && prefixed && file_of_.count(key.substr(base.size())))
      key = key.substr(base.size());
    const auto at = file_of_.find(key);
    if (at == file_of_.end())
      throw Error(dir_ + ": no tensor " + e.hf + " " + shape_text(e.hf_shape()) + " in " +
                  (file_names_.size() == 1 ? file_names_.front()
                                           : "the files model.safetensors.index.json lists") +
                  "; a " + model_type_ + " model of config.json has it");
    const SafetensorsFile& file = files_[size_t(at->second)];
    const TensorInfo& info = file.tensors().at(key);
    if (info.dtype != "F32" && info.dtype != "BF16" && info.dtype != "F16")
      throw Error(file.path() + ": tensor " + key + " is " + info.dtype +
                  "; import reads F32, BF16 and F16");
    if (info.shape != e.hf_shape())
      throw Error(file.path() + ": tensor " + key + " has shape " + shape_text(info.shape) +
                  ", but config.json makes it " + shape_text(e.hf_shape()));
    used.insert(key);
    ++dtypes_[info.dtype];
    sources_.push_back({e, at->second, key});
    return true;
  });
  for (const auto& [name, file] : file_of_) {
    if (used.count(name)) continue;
    if (is_buffer(model_.family, name)) {
      ignored_.push_back(name);
      continue;
    }
    const bool tied_head = name == "lm_head.weight" && model_.tie_embeddings;
    throw Error(files_[size_t(file)].path() + " holds tensor " + name + ", which a " +
                model_type_ + " model of " + config_path + " does not have" +
                (tied_head ? " (tie_word_embeddings is true: the head is the embedding)" : ""));
  }
  for (const char* name : {"tokenizer.model", "tokenizer.json", "tokenizer_config.json"}) {
    const std::string path = dir_ + "/" + name;
    if (!fs::exists(path, ec)) continue;
    check_bounded_file(path, "tokenizer", kMaxHfTokenizerBytes);
    tokenizer_files_.push_back(path);
  }
}

void HfFolder::open_weights() {
  std::error_code ec;
  const std::string single = dir_ + "/model.safetensors";
  const std::string index_path = dir_ + "/model.safetensors.index.json";
  if (fs::exists(single, ec)) {  // as Hugging Face does, the single file first
    files_.emplace_back(single);
    file_names_ = {"model.safetensors"};
    for (const auto& [name, info] : files_.front().tensors()) file_of_[name] = 0;
    return;
  }
  if (!fs::exists(index_path, ec)) {
    const bool bin = fs::exists(dir_ + "/pytorch_model.bin", ec) ||
                     fs::exists(dir_ + "/pytorch_model.bin.index.json", ec);
    throw Error(dir_ + " has no model.safetensors and no model.safetensors.index.json" +
                std::string(bin ? " (PyTorch's pytorch_model.bin is not read: convert it to "
                                  "safetensors)" : ""));
  }
  const nlohmann::json index = read_json(index_path, "safetensors index");
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(index_path + " has no weight_map object {tensor: file}");
  std::map<std::string, int> opened;  // shard name -> files_
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string() || !plain_file_name(shard.get<std::string>()))
      throw Error(index_path + ": tensor " + name + " is in " + shard.dump() +
                  ", which is not the name of a file in the folder");
    const std::string file = shard.get<std::string>();
    if (!opened.count(file)) {
      const std::string path = dir_ + "/" + file;
      if (!fs::is_regular_file(path, ec))
        throw Error(index_path + " lists tensor " + name + " in " + file + ", which " +
                    (fs::exists(path, ec) ? "is not a regular file" : "is missing"));
      opened[file] = int(files_.size());
      files_.emplace_back(path);
      file_names_.push_back(file);
    }
    const int f = opened[file];
    if (!files_[size_t(f)].contains(name))
      throw Error(index_path + " lists tensor " + name + " in " + file +
                  ", which does not hold it");
    file_of_[name] = f;
  }
  if (files_.empty()) throw Error(index_path + ": weight_map lists no tensor");
  // The index and the shards agree: no shard holds a tensor the index lists elsewhere or not.
  for (size_t f = 0; f < files_.size(); ++f)
    for (const auto& [name, info] : files_[f].tensors()) {
      const auto it = file_of_.find(name);
      if (it == file_of_.end() || it->second != int(f))
        throw Error(files_[f].path() + " holds tensor " + name + ", which " + index_path +
                    (it == file_of_.end() ? " does not list"
                                          : " lists in " + file_names_[size_t(it->second)]));
    }
}

}  // namespace cleave
