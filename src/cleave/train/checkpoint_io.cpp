#include "cleave/train/checkpoint_io.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

namespace cleave {

namespace {

constexpr const char* kFile = "model-rank00000.safetensors";

// key -> "key = value" of one table of a resolved config, to name what differs between two.
std::map<std::string, std::string> lines_of(const std::string& toml, const std::string& table) {
  std::map<std::string, std::string> out;
  std::istringstream in(toml);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.rfind("[", 0) == 0) current = line.substr(1, line.size() - 2);
    else if (current == table && !line.empty()) out[line.substr(0, line.find(' '))] = line;
  }
  return out;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

void save_training_checkpoint(const std::string& dir, const Config& cfg, int64_t step,
                              ParamStore& params, const OptimizerState& optim, int world_size) {
  std::vector<TensorView> views;
  nlohmann::json tensors = nlohmann::json::object();
  const std::pair<const char*, const float*> parts[] = {{"param/", params.values().data()},
                                                  {"adam_m/", optim.m},
                                                  {"adam_v/", optim.v}};
  for (const auto& [prefix, base] : parts) {
    for (const ParamTensor& p : params.tensors()) {
      const std::string name = prefix + p.name;
      views.push_back({name, "F32", p.shape, base + p.offset, uint64_t(p.numel) * 4});
      tensors[name] = {{"shape", p.shape}, {"dtype", "F32"}, {"file", kFile}};
    }
  }
  const nlohmann::json meta = {
      {"step", step},
      {"config", to_toml(cfg)},
      {"data", {{"seed", cfg.train.seed}, {"next_step", step}}},
      {"optimizer", {{"name", "adamw"}, {"steps_taken", optim.steps_taken}}},
      {"mesh", {{"world_size", world_size}}},
      {"tensors", tensors}};
  write_checkpoint_folder(dir, meta, views);
}

Config checkpoint_config(const LoadedCheckpoint& ck, const std::string& dir) {
  if (!ck.meta.contains("config") || !ck.meta["config"].is_string())
    throw Error("checkpoint " + dir + "/meta.json has no \"config\"");
  return parse_config(ck.meta["config"].get<std::string>(), dir + "/meta.json:config");
}

int64_t restore_training_state(const LoadedCheckpoint& ck, const std::string& dir,
                               const Config& cfg, ParamStore& params, OptimizerState* optim) {
  const auto saved = lines_of(ck.meta.at("config").get<std::string>(), "model");
  for (auto& [key, line] : lines_of(to_toml(cfg), "model"))
    if (saved.count(key) && saved.at(key) != line)
      throw Error("checkpoint " + dir + " was written with model." + saved.at(key) +
                  " but the config has model." + line);
  const SafetensorsFile& f = ck.files.at(0);
  for (const ParamTensor& p : params.tensors()) {
    f.read_f32("param/" + p.name, p.shape, params.values().data() + p.offset);
    if (optim) {
      f.read_f32("adam_m/" + p.name, p.shape, optim->m + p.offset);
      f.read_f32("adam_v/" + p.name, p.shape, optim->v + p.offset);
    }
  }
  if (optim) optim->steps_taken = ck.meta.at("optimizer").at("steps_taken").get<int64_t>();
  return ck.meta.at("step").get<int64_t>();
}

std::unique_ptr<Transformer> load_model(const std::string& path, Precision precision, Config* cfg) {
  std::string dir = path;
  if (!std::filesystem::exists(path + "/meta.json")) {  // a run folder: its newest checkpoint
    const std::string latest = latest_checkpoint(path);
    if (!latest.empty()) dir = latest;
  }
  const LoadedCheckpoint ck = read_checkpoint_folder(dir);
  *cfg = checkpoint_config(ck, dir);
  auto model = std::make_unique<Transformer>(cfg->model, precision, cfg->train.seed);
  restore_training_state(ck, dir, *cfg, model->params(), nullptr);
  model->weights_changed();
  return model;
}

}  // namespace cleave
