#include "cleave/train/checkpoint_io.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <tuple>

namespace cleave {

namespace {

constexpr const char* kKinds[] = {"param", "adam_m", "adam_v"};

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

struct SavedPiece {
  const SafetensorsFile* file;
  int64_t begin, end;  // elements of the flattened tensor
};

// Where the checkpoint keeps the elements of tensor `name` (of the model's `shape`): its pieces in
// element order, checked to tile the tensor exactly. Version 1 kept each tensor whole in one file.
std::vector<SavedPiece> saved_pieces(const LoadedCheckpoint& ck, const std::string& dir,
                                     const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t numel) {
  CLEAVE_CHECK(ck.meta.contains("tensors") && ck.meta["tensors"].contains(name),
               "checkpoint " << dir << " has no tensor " << name);
  const nlohmann::json& t = ck.meta["tensors"][name];
  std::vector<int64_t> saved_shape;
  std::vector<std::tuple<std::string, int64_t, int64_t>> listed;  // file, begin, end
  try {
    saved_shape = t.at("shape").get<std::vector<int64_t>>();
    if (t.contains("pieces")) {
      for (const nlohmann::json& p : t.at("pieces"))
        listed.emplace_back(p.at("file").get<std::string>(), p.at("begin").get<int64_t>(),
                            p.at("end").get<int64_t>());
    } else {
      listed.emplace_back(t.at("file").get<std::string>(), 0, numel);
    }
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL("checkpoint " << dir << "/meta.json: tensor " << name << ": " << e.what());
  }
  CLEAVE_CHECK(saved_shape == shape, "checkpoint " << dir << ": tensor " << name << " has shape "
                                                   << shape_text(saved_shape)
                                                   << ", the model's is " << shape_text(shape));
  auto file_of = [&](const std::string& file) {
    for (const SafetensorsFile& f : ck.files)
      if (f.path() == dir + "/" + file) return &f;
    CLEAVE_FAIL("checkpoint " << dir << ": tensor " << name << " is in " << file
                              << ", which meta.json does not list");
  };
  std::vector<SavedPiece> out;
  for (const auto& [file, begin, end] : listed) out.push_back({file_of(file), begin, end});
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  int64_t at = 0;
  for (const SavedPiece& p : out) {
    CLEAVE_CHECK(p.begin == at && p.end > p.begin,
                 "checkpoint " << dir << ": the pieces of tensor " << name
                               << " do not tile its elements (gap or overlap at element " << at
                               << ")");
    at = p.end;
  }
  CLEAVE_CHECK(at == numel, "checkpoint " << dir << ": the pieces of tensor " << name << " end at "
                                          << at << " of its " << numel << " elements");
  return out;
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

std::string state_file_name(int index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-rank%05d.safetensors", index);
  return buf;
}

std::string write_state_file(const std::string& tmp, int index, const ParamStore& params,
                             const StateSlices& state) {
  std::vector<TensorView> views;
  const RangeBuffer buffers[] = {state.values, state.m, state.v};
  for (const TensorPiece& piece : tensor_pieces(params, state.ranges)) {
    const ParamTensor& t = params.tensor(piece.tensor);
    const int64_t count = piece.end - piece.begin;
    const std::vector<int64_t> shape = count == t.numel ? t.shape : std::vector<int64_t>{count};
    for (int k = 0; k < 3; ++k)
      views.push_back({std::string(kKinds[k]) + "/" + t.name, "F32", shape,
                       piece.in(buffers[k]), uint64_t(count) * 4});
  }
  return write_safetensors(tmp + "/" + state_file_name(index), views,
                           {{"format", "cleave-checkpoint"}, {"rank", std::to_string(index)}});
}

void finish_training_checkpoint(const std::string& dir, const std::string& tag, const Config& cfg,
                                int64_t step, const ParamStore& params,
                                const std::vector<std::vector<FlatRange>>& ranges_of_file,
                                int own_file, const std::string& own_checksum,
                                int64_t optimizer_steps, int world_size) {
  nlohmann::json tensors = nlohmann::json::object();
  std::map<std::string, std::string> files;  // name -> checksum, "" where another rank wrote it
  for (size_t i = 0; i < ranges_of_file.size(); ++i) {
    const std::string file = state_file_name(int(i));
    files[file] = int(i) == own_file ? own_checksum : "";
    for (const TensorPiece& piece : tensor_pieces(params, ranges_of_file[i])) {
      const ParamTensor& t = params.tensor(piece.tensor);
      for (const char* kind : kKinds) {
        nlohmann::json& entry = tensors[std::string(kind) + "/" + t.name];
        entry["shape"] = t.shape;
        entry["dtype"] = "F32";
        entry["pieces"].push_back({{"file", file}, {"begin", piece.begin}, {"end", piece.end}});
      }
    }
  }
  const nlohmann::json meta = {
      {"step", step},
      {"config", to_toml(cfg)},
      {"data", {{"seed", cfg.train.seed}, {"next_step", step}}},
      {"optimizer", {{"name", "adamw"}, {"steps_taken", optimizer_steps}}},
      {"mesh", {{"world_size", world_size}, {"files", files.size()}}},
      {"tensors", tensors}};
  finish_checkpoint_folder(dir, tag, meta, files);
}

Config checkpoint_config(const LoadedCheckpoint& ck, const std::string& dir) {
  if (!ck.meta.contains("config") || !ck.meta["config"].is_string())
    throw Error("checkpoint " + dir + "/meta.json has no \"config\"");
  return parse_config(ck.meta["config"].get<std::string>(), dir + "/meta.json:config");
}

int64_t checkpoint_step(const LoadedCheckpoint& ck, const std::string& dir, const Config& cfg) {
  CLEAVE_CHECK(ck.meta.contains("config") && ck.meta["config"].is_string(),
               "checkpoint " << dir << "/meta.json has no \"config\"");
  const auto saved = lines_of(ck.meta["config"].get<std::string>(), "model");
  for (auto& [key, line] : lines_of(to_toml(cfg), "model"))
    if (saved.count(key) && saved.at(key) != line)
      throw Error("checkpoint " + dir + " was written with model." + saved.at(key) +
                  " but the config has model." + line);
  CLEAVE_CHECK(ck.meta.contains("step") && ck.meta["step"].is_number_integer(),
               "checkpoint " << dir << "/meta.json has no integer \"step\"");
  return ck.meta["step"].get<int64_t>();
}

int64_t checkpoint_optimizer_steps(const LoadedCheckpoint& ck, const std::string& dir) {
  CLEAVE_CHECK(ck.meta.contains("optimizer") && ck.meta["optimizer"].contains("steps_taken") &&
                   ck.meta["optimizer"]["steps_taken"].is_number_integer(),
               "checkpoint " << dir << "/meta.json has no integer optimizer.steps_taken");
  return ck.meta["optimizer"]["steps_taken"].get<int64_t>();
}

void read_state(const LoadedCheckpoint& ck, const std::string& dir, const ParamStore& params,
                const std::string& kind, const std::vector<FlatRange>& ranges, RangeBuffer out) {
  for (const TensorPiece& piece : tensor_pieces(params, ranges)) {
    const ParamTensor& t = params.tensor(piece.tensor);
    const std::string name = kind + "/" + t.name;
    float* dst = piece.in(out);
    for (const SavedPiece& s : saved_pieces(ck, dir, name, t.shape, t.numel)) {
      const int64_t lo = std::max(s.begin, piece.begin), hi = std::min(s.end, piece.end);
      if (lo < hi)
        s.file->read_f32_elements(name, s.end - s.begin, lo - s.begin, hi - lo,
                                  dst + (lo - piece.begin));
    }
  }
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
  ParamStore& params = model->params();
  read_state(ck, dir, params, "param", {{0, params.total()}}, {params.values().data()});
  model->weights_changed();
  return model;
}

}  // namespace cleave
