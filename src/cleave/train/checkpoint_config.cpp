#include "cleave/train/checkpoint_config.h"

#include <cstdint>
#include <map>
#include <optional>
#include <sstream>

#include "cleave/base/check.h"

namespace cleave {

namespace {

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

int64_t checkpoint_step(const LoadedCheckpoint& ck, const std::string& dir, const Config& cfg) {
  if (!ck.meta.contains("config") || !ck.meta["config"].is_string())
    throw Error("checkpoint " + dir + "/meta.json has no \"config\"");
  const auto saved = lines_of(ck.meta["config"].get<std::string>(), "model");
  for (auto& [key, line] : lines_of(to_toml(cfg), "model"))
    if (saved.count(key) && saved.at(key) != line)
      throw Error("checkpoint " + dir + " was written with model." + saved.at(key) +
                  " but the config has model." + line);
  if (!ck.meta.contains("step") || !ck.meta["step"].is_number_integer())
    throw Error("checkpoint " + dir + "/meta.json has no integer \"step\"");
  // A step outside [0, 2^53] is no run's: negative, it would train at a negative learning rate;
  // near 2^63, the next step wraps.
  const nlohmann::json& saved_step = ck.meta["step"];
  const bool beyond = saved_step.is_number_unsigned() && saved_step.get<uint64_t>() > uint64_t(INT64_MAX);
  const int64_t step = beyond ? -1 : saved_step.get<int64_t>();
  if (step < 0 || step > (int64_t(1) << 53))
    throw Error("checkpoint " + dir + "/meta.json: \"step\" = " + saved_step.dump() +
                " is out of range [0, 2^53]");
  return step;
}

std::vector<std::string> resume_changes(const LoadedCheckpoint& ck, const std::string& dir,
                                        const Config& cfg) {
  // Read off the saved config's text, as checkpoint_step does, so that a checkpoint whose config
  // this version would not parse still resumes; a key it lacks is not compared.
  const auto saved = lines_of(ck.meta["config"].get<std::string>(), "train");
  auto was = [&](const std::string& key) -> std::optional<uint64_t> {
    const auto it = saved.find(key);
    if (it == saved.end()) return std::nullopt;
    try {
      return std::stoull(it->second.substr(it->second.find('=') + 1));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const TrainConfig& now = cfg.train;
  std::vector<std::string> out;
  auto compare = [&](const std::string& what, std::optional<uint64_t> before, uint64_t after) {
    if (before && *before != after)
      out.push_back(what + " is " + std::to_string(after) + ", " + std::to_string(*before) +
                    " in checkpoint " + dir);
  };
  compare("train.seed", was("seed"), now.seed);
  compare("train.seq_len", was("seq_len"), uint64_t(now.seq_len));
  const auto mb = was("micro_batch_size"), accum = was("grad_accum_steps");
  compare("the global batch (train.micro_batch_size x train.grad_accum_steps)",
          mb && accum ? std::optional<uint64_t>(*mb * *accum) : std::nullopt,
          uint64_t(now.micro_batch_size) * uint64_t(now.grad_accum_steps));
  return out;
}

std::vector<std::string> model_differences(const LoadedCheckpoint& ck, const std::string& dir,
                                           const Config& cfg) {
  if (!ck.meta.contains("config") || !ck.meta["config"].is_string())
    throw Error("checkpoint " + dir + "/meta.json has no \"config\"");
  const auto saved = lines_of(ck.meta["config"].get<std::string>(), "model");
  std::vector<std::string> out;
  for (auto& [key, line] : lines_of(to_toml(cfg), "model"))
    if (saved.count(key) && saved.at(key) != line) {
      const std::string& was = saved.at(key);
      out.push_back("model." + line + " in this run, " + was.substr(was.find('=') + 2) +
                    " in checkpoint " + dir);
    }
  return out;
}

}  // namespace cleave
