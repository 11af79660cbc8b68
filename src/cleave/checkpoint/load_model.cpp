#include "cleave/checkpoint/load_model.h"

#include <cstdint>
#include <filesystem>
#include <optional>

#include "cleave/base/check.h"
#include "cleave/base/toml_keys.h"
#include "cleave/checkpoint/training_state.h"
#include "cleave/model/model_keys.h"

namespace cleave {

ModelCheckpoint open_model_checkpoint(const std::string& path) {
  ModelCheckpoint out;
  out.dir = path;
  if (!std::filesystem::exists(path + "/meta.json")) {  // a run folder: its newest checkpoint
    const std::string latest = latest_checkpoint(path);
    if (!latest.empty()) out.dir = latest;
  }
  out.ck = read_checkpoint_folder(out.dir);
  if (!out.ck.meta.contains("config") || !out.ck.meta["config"].is_string())
    throw Error("checkpoint " + out.dir + "/meta.json has no \"config\"");
  const std::string origin = out.dir + "/meta.json:config";
  // The resolved config the trainer wrote; only [model], the seed and the data folder matter here.
  const toml::table config = parse_toml(out.ck.meta["config"].get<std::string>(), origin);
  const std::optional<int64_t> seed = config["train"]["seed"].value<int64_t>();
  const std::optional<std::string> data_dir = config["data"]["dir"].value<std::string>();
  if (!seed || !data_dir) throw Error(origin + " has no train.seed or no data.dir");
  out.model = read_model_config(config, origin);
  out.seed = uint64_t(*seed);
  out.data_dir = *data_dir;
  return out;
}

LoadedModel load_model(const ModelCheckpoint& opened, Precision precision,
                       const TensorParallelOptions& tp, std::vector<ModelChunk> chunks,
                       EpComm* ep) {
  CLEAVE_CHECK(!tp.sequence_parallel, "a model loaded for inference runs without sequence parallelism");
  // Unmaterialised: its parameters' pages stay untouched until read, so a saved config that asks
  // for a huge model costs nothing before its shapes are compared with the saved tensors'.
  LoadedModel out{std::make_unique<Transformer>(opened.model, precision, opened.seed, 1,
                                                ParamValues::unset, tp, std::move(chunks),
                                                ContextParallelOptions{}, ep),
                  opened.data_dir, opened.dir};
  ParamStore& params = out.model->params();
  check_saved_shapes(opened.ck, opened.dir, params, "param");
  // The flat layout is the rank's: its slices of every tensor are what is read.
  read_state(opened.ck, opened.dir, params, "param", {{0, params.total()}}, {params.values().data()});
  params.wrote_all();
  read_moe_biases(opened.ck, opened.dir, out.model->moe_biases());
  return out;
}

LoadedModel load_model(const std::string& path, Precision precision) {
  return load_model(open_model_checkpoint(path), precision);
}

}  // namespace cleave
