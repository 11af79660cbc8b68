#include "cleave/data/tokenizer_config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cleave/base/check.h"
#include "cleave/base/file.h"

namespace cleave {

namespace {

// A config lists a few dozen keys and a template of some kilobytes; Llama 3's is 50 KB.
constexpr int64_t kMaxConfigBytes = 64 * kMiB;

// A special token is written as its text or as an AddedToken object holding it in "content".
std::optional<std::string> token_text(const nlohmann::json& j, const std::string& path,
                                      const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const nlohmann::json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  CLEAVE_FAIL(path << ": " << key << " must be a string or an object with a string "
                   << "\"content\", not " << v.dump().substr(0, 80));
}

bool flag(const nlohmann::json& j, const std::string& path, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return false;
  CLEAVE_CHECK(j[key].is_boolean(), path << ": " << key << " must be true or false, not "
                                         << j[key].dump().substr(0, 80));
  return j[key].get<bool>();
}

std::string chat_template(const nlohmann::json& j, const std::string& path) {
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return "";
  const nlohmann::json& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  // Several named templates: [{"name": ..., "template": ...}, ...]
  CLEAVE_CHECK(t.is_array(), path << ": chat_template must be a string or a list of {name, "
                                     "template} objects");
  for (size_t i = 0; i < t.size(); ++i) {
    const nlohmann::json& e = t[i];
    CLEAVE_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() &&
                     e.contains("template") && e["template"].is_string(),
                 path << ": chat_template[" << i << "] must be an object with string \"name\" "
                                                 "and \"template\"");
    if (e["name"] == "default") return e["template"].get<std::string>();
  }
  return "";
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  TokenizerConfig out;
  const std::string path =
      (fs::path(tokenizer_path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  const std::string text = read_bounded_file(path, "tokenizer config", kMaxConfigBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    CLEAVE_FAIL(path << ": not JSON: " << e.what());
  }
  CLEAVE_CHECK(j.is_object(), path << ": not a JSON object");
  out.path = path;
  out.chat_template = chat_template(j, path);
  out.bos_token = token_text(j, path, "bos_token");
  out.eos_token = token_text(j, path, "eos_token");
  out.add_bos_token = flag(j, path, "add_bos_token");
  out.add_eos_token = flag(j, path, "add_eos_token");
  return out;
}

}  // namespace cleave
