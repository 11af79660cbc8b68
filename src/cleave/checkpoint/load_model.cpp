#include "cleave/checkpoint/load_model.h"

#include <cstdint>
#include <filesystem>
#include <optional>

#include "cleave/base/check.h"
#include "cleave/base/toml_keys.h"
#include "cleave/checkpoint/folder.h"
#include "cleave/checkpoint/training_state.h"
#include "cleave/model/model_keys.h"

namespace cleave {

LoadedModel load_model(const std::string& path, Precision precision) {
  std::string dir = path;
  if (!std::filesystem::exists(path + "/meta.json")) {  // a run folder: its newest checkpoint
    const std::string latest = latest_checkpoint(path);
    if (!latest.empty()) dir = latest;
  }
  const LoadedCheckpoint ck = read_checkpoint_folder(dir);
  if (!ck.meta.contains("config") || !ck.meta["config"].is_string())
    throw Error("checkpoint " + dir + "/meta.json has no \"config\"");
  const std::string origin = dir + "/meta.json:config";
  // The resolved config the trainer wrote; only [model], the seed and the data folder matter here.
  const toml::table config = parse_toml(ck.meta["config"].get<std::string>(), origin);
  const std::optional<int64_t> seed = config["train"]["seed"].value<int64_t>();
  const std::optional<std::string> data_dir = config["data"]["dir"].value<std::string>();
  if (!seed || !data_dir) throw Error(origin + " has no train.seed or no data.dir");
  // Unmaterialised: its parameters' pages stay untouched until read, so a saved config that asks
  // for a huge model costs nothing before its shapes are compared with the saved tensors'.
  LoadedModel out{std::make_unique<Transformer>(read_model_config(config, origin), precision,
                                                uint64_t(*seed), 1, ParamValues::unset),
                  *data_dir, dir};
  ParamStore& params = out.model->params();
  check_saved_shapes(ck, dir, params, "param");
  read_state(ck, dir, params, "param", {{0, params.total()}}, {params.values().data()});
  params.wrote_all();
  read_moe_biases(ck, dir, out.model->moe_biases());
  return out;
}

}  // namespace cleave
