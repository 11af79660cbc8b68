#include "cleave/checkpoint/inspect.h"

#include <cstdio>
#include <sstream>

#include "cleave/base/check.h"
#include "cleave/base/toml_keys.h"
#include "cleave/checkpoint/training_state.h"

namespace cleave {

namespace {

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1 << 20));
  return buf;
}

// The saved run's layout, as its config says it: every [parallel] key and train.dtype.
std::string layout_of(const nlohmann::json& meta, const std::string& dir) {
  if (!meta.contains("config") || !meta["config"].is_string()) return "not recorded";
  const toml::table config = parse_toml(meta["config"].get<std::string>(), dir + "/meta.json:config");
  std::ostringstream os;
  if (const toml::table* parallel = config["parallel"].as_table())
    for (const auto& [key, value] : *parallel) {
      os << key.str() << " = ";
      value.visit([&](const auto& v) {
        if constexpr (toml::is_string<decltype(v)>) os << '"' << v.get() << '"';
        else if constexpr (toml::is_boolean<decltype(v)>) os << (v.get() ? "true" : "false");
        else if constexpr (toml::is_number<decltype(v)>) os << v.get();
        else if constexpr (toml::is_array<decltype(v)>) {
          os << '[';
          for (size_t i = 0; i < v.size(); ++i)
            os << (i ? ", " : "") << v[i].template value<int64_t>().value_or(0);
          os << ']';
        } else {
          os << "{...}";
        }
      });
      os << ", ";
    }
  os << "train.dtype = " << config["train"]["dtype"].value_or(std::string("fp32"));
  return os.str();
}

std::string checksums_text(const std::vector<std::string>& sums) {
  std::string out;
  for (size_t i = 0; i < sums.size() && i < 4; ++i) out += (i ? "," : "") + sums[i];
  if (sums.size() > 4) out += ",... (" + std::to_string(sums.size()) + " chunks)";
  return out.empty() ? "(no bytes)" : out;
}

}  // namespace

std::string describe_checkpoint(const LoadedCheckpoint& ck, const std::string& dir) {
  const nlohmann::json& m = ck.meta;
  std::ostringstream os;
  uint64_t bytes = ck.meta_bytes;
  for (const SafetensorsFile& f : ck.files) bytes += f.size();
  os << "checkpoint " << dir << "\n";
  os << "  format " << m.value("format", std::string("?")) << " version " << m.value("version", 0)
     << ", step " << (m.contains("step") ? m["step"].dump() : "?") << ", " << ck.files.size()
     << " files, " << mib(double(bytes)) << "\n";
  if (m.contains("mesh")) os << "  written by " << m["mesh"].value("world_size", 0) << " ranks\n";
  os << "  layout: " << layout_of(m, dir) << "\n";
  if (m.contains("optimizer"))
    os << "  optimizer: " << m["optimizer"].value("name", std::string("?")) << ", "
       << m["optimizer"].value("steps_taken", int64_t(0)) << " steps taken\n";
  if (m.contains("loss_scaler")) os << "  loss scaler: " << m["loss_scaler"].dump() << "\n";
  if (m.contains("fp8") && m["fp8"].contains("file"))
    os << "  FP8 scaling: " << m["fp8"].value("recipe", std::string("?")) << ", "
       << m["fp8"].value("linears", int64_t(0)) << " linears, amax history of "
       << m["fp8"].value("history_steps", int64_t(0)) << " steps in "
       << m["fp8"].value("file", std::string("?")) << "\n";
  if (m.contains("moe_bias")) os << "  MoE router biases of " << m["moe_bias"].size() << " layers\n";
  const bool chunked = m.value("version", 0) >= 4;
  os << "  files:\n";
  for (const auto& [name, sums] : m["files"].items()) {
    os << "    " << name << ": ";
    if (chunked)
      os << sums.value("bytes", uint64_t(0)) << " bytes, header xxh64 "
         << sums.value("header_xxh64", std::string("?")) << ", chunks of "
         << sums.value("chunk_bytes", uint64_t(0)) << " bytes\n";
    else
      os << "xxh64 " << sums.get<std::string>() << " (whole file)\n";
  }
  if (!m.contains("tensors")) return os.str();
  os << "  tensors:\n";
  for (const auto& [name, t] : m["tensors"].items()) {
    const nlohmann::json pieces = t.value("pieces", nlohmann::json::array());
    os << "    " << name << " " << t.value("dtype", std::string("F32")) << " "
       << t.value("shape", nlohmann::json::array()).dump() << ", " << pieces.size() << " piece"
       << (pieces.size() == 1 ? "" : "s") << "\n";
    for (const nlohmann::json& p : pieces) {
      const std::string file = p.value("file", std::string("?"));
      const std::string key = p.value("key", name);
      const int64_t begin = p.value("begin", int64_t(0)), end = p.value("end", int64_t(0));
      os << "      " << file << " " << key << ": offset "
         << p.value("offset", nlohmann::json::array()).dump() << " box "
         << p.value("box", nlohmann::json::array()).dump() << " elements [" << begin << ", "
         << end << "), " << 4 * (end - begin) << " bytes";
      if (chunked && m["files"].contains(file)) {
        const nlohmann::json& chunks = m["files"][file].value("chunks_xxh64", nlohmann::json::object());
        if (chunks.contains(key))
          os << ", xxh64 " << checksums_text(chunks[key].get<std::vector<std::string>>());
      }
      os << "\n";
    }
  }
  return os.str();
}

std::string verify_checkpoint(const std::string& dir) {
  const LoadedCheckpoint ck = read_checkpoint_folder(dir);  // sizes and headers, or whole files
  check_saved_pieces(ck, dir);
  uint64_t bytes = 0;
  for (const SafetensorsFile& f : ck.files) {
    f.verify_all();
    bytes += f.size();
  }
  std::ostringstream os;
  os << "verified " << dir << ": " << ck.files.size() << " files, " << mib(double(bytes))
     << ", every checksum matches and every tensor's pieces tile it";
  return os.str();
}

}  // namespace cleave
