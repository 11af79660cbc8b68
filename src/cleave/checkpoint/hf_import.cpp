#include "cleave/checkpoint/hf_import.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "cleave/base/buffer.h"
#include "cleave/base/file.h"
#include "cleave/checkpoint/folder.h"
#include "cleave/checkpoint/training_state.h"
#include "cleave/kernels/convert.h"
#include "cleave/model/hf_config.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

// config.json and the index are kilobytes (a large model's index: about 100 KB).
constexpr int64_t kMaxJsonBytes = 64 * kMiB;
constexpr int64_t kMaxTokenizerBytes = 256 * kMiB;

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

void write_synced(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = w < 0 ? std::strerror(errno) : "no progress";
      ::close(fd);
      throw Error("cannot write " + path + ": " + why);
    }
    done += size_t(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string why = synced ? "" : std::strerror(errno);
  if (::close(fd) != 0 || !synced) throw Error("cannot write " + path + ": " + why);
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
    check_bounded_file(path, "tokenizer", kMaxTokenizerBytes);
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

void HfFolder::read_f32(const Source& s, float* out) const {
  const SafetensorsFile& file = files_[size_t(s.file)];
  const TensorInfo& info = file.tensors().at(s.key);
  if (info.dtype == "F32") {
    file.read(s.key, "F32", info.shape, out);
    return;
  }
  std::vector<uint16_t> half(size_t(s.entry.hf_numel()));
  file.read(s.key, info.dtype, info.shape, half.data());
  if (info.dtype == "BF16") kernels::bf16_to_f32(out, half.data(), int64_t(half.size()));
  else kernels::f16_to_f32(out, half.data(), int64_t(half.size()));
}

int64_t HfFolder::write_checkpoint(const std::string& out, const std::string& config,
                                   uint64_t seed) const {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)))
    throw Error(out + " exists; import writes a new checkpoint folder: remove it or choose "
                "another OUT_CHECKPOINT");
  // The parameters as the table names them, each once (its rows may come from several tensors),
  // in one unit: a checkpoint's pieces are named and placed by tensor, not by the layout of the
  // flat buffer, so any layout reads them.
  ParamStore params;
  for (const Source& s : sources_)
    if (!s.entry.param.empty() && params.find(s.entry.param) < 0)
      params.add(s.entry.param, s.entry.param_shape, Init::zeros);
  params.allocate(0, 1, false);
  std::vector<int64_t> filled(params.tensors().size(), 0);
  nlohmann::json moe_bias = nullptr;
  std::vector<float> hf;  // a tensor that is not rows of its parameter as they are
  for (const Source& s : sources_) {
    const HfEntry& e = s.entry;
    if (e.layout == HfLayout::router_bias) {
      hf.resize(size_t(e.hf_numel()));
      read_f32(s, hf.data());
      moe_bias[std::to_string(e.layer)] = hf;
      continue;
    }
    const int i = params.find(e.param);
    if (e.layout == HfLayout::transposed) {
      hf.resize(size_t(e.hf_numel()));
      read_f32(s, hf.data());
      e.from_hf(hf.data(), params.value(i));
    } else {  // straight into its rows
      read_f32(s, params.value(i) + (e.layout == HfLayout::rows ? e.row0 * e.param_shape[1] : 0));
    }
    filled[size_t(i)] += e.hf_numel();
  }
  for (size_t i = 0; i < filled.size(); ++i)
    CLEAVE_CHECK(filled[i] == params.tensor(int(i)).numel,
                 "the Hugging Face table fills " << filled[i] << " of the "
                                                 << params.tensor(int(i)).numel << " elements of "
                                                 << params.tensor(int(i)).name);
  const std::string tag = std::to_string(::getpid());
  begin_checkpoint_folder(out, tag);
  try {
    const std::string tmp = checkpoint_temp_folder(out, tag);
    Buffer<float> zeros(params.total());  // AdamW's moments: never written, so never resident
    const StateSlices state{{{0, params.total()}},
                            {params.values().data(), false},
                            {zeros.data(), false},
                            {zeros.data(), false},
                            TpCopy{}};
    const FileChecksums sums = write_state_file(tmp, 0, params, state);
    for (const std::string& path : tokenizer_files_)
      write_synced(tmp + "/" + fs::path(path).filename().string(),
                   read_bounded_file(path, "tokenizer", kMaxTokenizerBytes));
    finish_training_checkpoint(out, tag, config, seed, 0, {state_file_entries(0, params, state)},
                               {{0, sums}}, 0, 1, nullptr, moe_bias);
  } catch (...) {
    abandon_checkpoint_folder(out, tag);
    throw;
  }
  return params.count();
}

}  // namespace cleave
