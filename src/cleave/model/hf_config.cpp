#include "cleave/model/hf_config.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <type_traits>
#include <variant>
#include <vector>

#include "cleave/base/toml_keys.h"
#include "cleave/model/hf_layout.h"
#include "cleave/model/model_keys.h"

namespace cleave {

namespace {

using M = ModelConfig;
using Field = std::variant<int M::*, float M::*, bool M::*, MoeRouter M::*>;

// What import takes when config.json lacks a key or holds null there.
enum class Absent {
  required,
  resolved,    // [model]'s own resolution, which is Hugging Face's too (n_kv_heads = n_heads, ...)
  hf_default,  // Hugging Face's default for the architecture
};

// One key of config.json and the [model] key it is. Two keys of one architecture may name the
// same [model] key (GPT-2's n_positions and n_ctx): import takes the first and checks that the
// other agrees.
struct HfKey {
  std::string hf;
  std::string model_key;  // its range and the model's rules check what import reads
  Field field;
  Absent absent = Absent::required;
  nlohmann::json hf_default = nullptr;
};

// A value cleave's model fixes.
struct HfFixed {
  std::string hf;
  nlohmann::json value;
  bool written;  // export writes it
  bool checked;  // import refuses another value (an absent key is Hugging Face's default: this)
};

struct HfArchitecture {
  std::string model_type, architecture;
  Family family = Family::gpt2;
  std::vector<HfKey> keys;
  std::vector<HfFixed> fixed;
};

HfKey required(std::string hf, std::string key, Field field) {
  return {std::move(hf), std::move(key), field};
}
HfKey resolved(std::string hf, std::string key, Field field) {
  return {std::move(hf), std::move(key), field, Absent::resolved};
}
HfKey or_default(std::string hf, std::string key, Field field, nlohmann::json value) {
  return {std::move(hf), std::move(key), field, Absent::hf_default, std::move(value)};
}

HfArchitecture gpt2() {
  return {"gpt2",
          "GPT2LMHeadModel",
          Family::gpt2,
          {required("vocab_size", "model.vocab_size", &M::vocab_size),
           or_default("n_positions", "model.max_seq_len", &M::max_seq_len, 1024),
           resolved("n_ctx", "model.max_seq_len", &M::max_seq_len),
           required("n_embd", "model.d_model", &M::d_model),
           required("n_layer", "model.n_layers", &M::n_layers),
           required("n_head", "model.n_heads", &M::n_heads),
           resolved("n_inner", "model.ffn_hidden", &M::ffn_hidden),  // null: 4 x n_embd
           or_default("layer_norm_epsilon", "model.norm_eps", &M::norm_eps, 1e-5),
           or_default("initializer_range", "model.init_std", &M::init_std, 0.02),
           or_default("tie_word_embeddings", "model.tie_embeddings", &M::tie_embeddings, true)},
          {{"activation_function", "gelu_new", true, true},
           {"resid_pdrop", 0.0, true, false},
           {"embd_pdrop", 0.0, true, false},
           {"attn_pdrop", 0.0, true, false},
           {"torch_dtype", "float32", true, false},
           {"scale_attn_weights", true, false, true},
           {"scale_attn_by_inverse_layer_idx", false, false, true},
           {"add_cross_attention", false, false, true}}};
}

HfArchitecture llama() {
  return {"llama",
          "LlamaForCausalLM",
          Family::llama,
          {required("vocab_size", "model.vocab_size", &M::vocab_size),
           required("hidden_size", "model.d_model", &M::d_model),
           required("intermediate_size", "model.ffn_hidden", &M::ffn_hidden),
           required("num_hidden_layers", "model.n_layers", &M::n_layers),
           required("num_attention_heads", "model.n_heads", &M::n_heads),
           resolved("num_key_value_heads", "model.n_kv_heads", &M::n_kv_heads),
           or_default("max_position_embeddings", "model.max_seq_len", &M::max_seq_len, 2048),
           or_default("rms_norm_eps", "model.norm_eps", &M::norm_eps, 1e-6),
           or_default("rope_theta", "model.rope_theta", &M::rope_theta, 10000.0),
           or_default("initializer_range", "model.init_std", &M::init_std, 0.02),
           or_default("tie_word_embeddings", "model.tie_embeddings", &M::tie_embeddings, false)},
          {{"hidden_act", "silu", true, true},
           {"attention_bias", false, true, true},
           {"torch_dtype", "float32", true, false},
           {"mlp_bias", false, false, true},
           {"rope_scaling", nullptr, false, true}}};
}

// cleave's balancing terms (docs/moe.md#balancing): the auxiliary loss per sequence, the z-loss
// per token. Mixtral's own auxiliary loss is per batch; its coefficient is read as cleave's.
void add_balancing(HfArchitecture& a) {
  a.keys.push_back(or_default("router_aux_loss_coef", "model.moe_aux_loss_coef",
                              &M::moe_aux_loss_coef, 0.001));
  a.keys.push_back(resolved("router_z_loss_coef", "model.moe_z_loss_coef", &M::moe_z_loss_coef));
  a.fixed.push_back({"router_aux_loss_form", "sequence", true, false});
}

HfArchitecture mixtral() {
  HfArchitecture a = llama();
  a.model_type = "mixtral";
  a.architecture = "MixtralForCausalLM";
  for (HfKey& k : a.keys) {
    if (k.hf == "intermediate_size") k = required(k.hf, "model.moe_ffn_hidden", &M::moe_ffn_hidden);
    if (k.hf == "num_key_value_heads") k.absent = Absent::hf_default, k.hf_default = 8;
    if (k.hf == "max_position_embeddings") k.hf_default = 4096 * 32;
    if (k.hf == "rms_norm_eps") k.hf_default = 1e-5;
    if (k.hf == "rope_theta") k.hf_default = 1e6;
  }
  a.keys.push_back(or_default("num_local_experts", "model.moe_experts", &M::moe_experts, 8));
  a.keys.push_back(or_default("num_experts_per_tok", "model.moe_top_k", &M::moe_top_k, 2));
  a.fixed.push_back({"sliding_window", nullptr, true, false});  // checked against the context
  a.fixed.push_back({"output_router_logits", false, true, false});
  add_balancing(a);
  return a;
}

// Every other mixture of experts: the family's keys and cleave's own.
HfArchitecture cleave_moe(Family base) {
  HfArchitecture a = base == Family::gpt2 ? gpt2() : llama();
  a.model_type = "cleave_moe";
  a.architecture = "CleaveMoeForCausalLM";
  for (auto [hf, field] : std::vector<std::pair<std::string, Field>>{
           {"moe_experts", &M::moe_experts},
           {"moe_top_k", &M::moe_top_k},
           {"moe_router", &M::moe_router},
           {"moe_shared_experts", &M::moe_shared_experts},
           {"moe_ffn_hidden", &M::moe_ffn_hidden},
           {"moe_every", &M::moe_every},
           {"moe_first_dense", &M::moe_first_dense}})
    a.keys.push_back(required(hf, "model." + hf, field));
  a.fixed.push_back({"base_model_type", family_name(base), true, true});
  add_balancing(a);
  return a;
}

HfArchitecture architecture_of(const ModelConfig& c) {
  if (c.moe_experts == 0) return c.family == Family::gpt2 ? gpt2() : llama();
  return is_mixtral(c) ? mixtral() : cleave_moe(c.family);
}

nlohmann::json value_of(const ModelConfig& c, const Field& field) {
  return std::visit(
      [&](auto member) -> nlohmann::json {
        if constexpr (std::is_same_v<decltype(member), MoeRouter M::*>)
          return moe_router_name(c.*member);
        else
          return c.*member;
      },
      field);
}

// A scalar of config.json as a TOML value, so that [model]'s own keys check and set it.
toml::table as_toml(const nlohmann::json& v, const std::string& where) {
  toml::table t;
  if (v.is_boolean()) t.insert("v", v.get<bool>());
  else if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
    t.insert("v", v.get<int64_t>());
  else if (v.is_number()) t.insert("v", v.get<double>());
  else if (v.is_string()) t.insert("v", v.get<std::string>());
  else throw Error(where + " is " + v.dump() + ", not a number, boolean or string");
  return t;
}

const ConfigKey<ModelConfig>& model_key(const std::string& name) {
  for (const ConfigKey<ModelConfig>& k : model_keys())
    if (k.name == name) return k;
  CLEAVE_FAIL("no [model] key " << name);
}

// [model]'s rules speak of cleave's keys: name config.json's beside them ("hidden_size
// (model.d_model)"), each where it stands as a whole key.
std::string with_hf_names(std::string message, const HfArchitecture& a) {
  for (const HfKey& k : a.keys)
    for (size_t at = message.find(k.model_key); at != std::string::npos;
         at = message.find(k.model_key, at + 1)) {
      const size_t end = at + k.model_key.size();
      if (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) ||
                                   message[end] == '_'))
        continue;
      if (at >= 1 && message[at - 1] == '(') continue;  // already named
      const std::string named = k.hf + " (" + k.model_key + ")";
      message.replace(at, k.model_key.size(), named);
      at += named.size() - k.model_key.size();
    }
  return message;
}

}  // namespace

nlohmann::json hf_config(const ModelConfig& c) {
  const HfArchitecture a = architecture_of(c);
  nlohmann::json j = nlohmann::json::object();
  j["architectures"] = nlohmann::json::array({a.architecture});
  j["model_type"] = a.model_type;
  for (const HfKey& k : a.keys) j[k.hf] = value_of(c, k.field);
  for (const HfFixed& f : a.fixed)
    if (f.written) j[f.hf] = f.value;
  return j;
}

ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& origin) {
  if (!config.is_object()) throw Error(origin + " is not a JSON object");
  if (!config.contains("model_type") || !config["model_type"].is_string())
    throw Error(origin + " has no model_type (a string: gpt2, llama, mixtral or cleave_moe)");
  const std::string type = config["model_type"].get<std::string>();
  HfArchitecture a;
  if (type == "gpt2") a = gpt2();
  else if (type == "llama") a = llama();
  else if (type == "mixtral") a = mixtral();
  else if (type == "cleave_moe") {
    const nlohmann::json base = config.value("base_model_type", nlohmann::json());
    if (base != "gpt2" && base != "llama")
      throw Error(origin + ": model_type \"cleave_moe\" needs base_model_type \"gpt2\" or "
                  "\"llama\", not " + base.dump());
    a = cleave_moe(base == "gpt2" ? Family::gpt2 : Family::llama);
  } else
    throw Error(origin + ": model_type \"" + type + "\" is not one cleave imports (gpt2, llama, "
                "mixtral, cleave_moe)");
  if (config.contains("architectures")) {
    const nlohmann::json& archs = config["architectures"];
    bool found = false;
    if (archs.is_array())
      for (const nlohmann::json& n : archs) found = found || n == a.architecture;
    if (!found)
      throw Error(origin + ": architectures is " + archs.dump() + "; cleave imports " +
                  a.architecture + " for model_type \"" + type +
                  "\" (a causal language model with its head)");
  }
  ModelConfig m;
  m.family = a.family;
  std::set<std::string> given;
  std::map<std::string, std::string> read_from;  // [model] key -> the config.json key it came from
  for (const HfKey& k : a.keys) {
    const std::string where = k.hf + " (" + k.model_key + ")";
    const nlohmann::json* v =
        config.contains(k.hf) && !config[k.hf].is_null() ? &config[k.hf] : nullptr;
    if (!v && k.absent == Absent::required)
      throw Error(origin + " has no " + k.hf + ", which a " + type + " config needs (cleave's " +
                  k.model_key + ")");
    if (!v && k.absent == Absent::resolved) continue;
    if (!v) v = &k.hf_default;
    const toml::table t = as_toml(*v, origin + ": " + k.hf);
    const toml::node& node = *t.get("v");
    const ConfigKey<ModelConfig>& key = model_key(k.model_key);
    check_value(key.kind, key.min, key.max, key.choices, node, where, origin);
    if (given.count(k.model_key)) {  // a second name of one key: it must agree with the first
      ModelConfig other = m;
      key.set(other, node);
      if (key.show(other) != key.show(m))
        throw Error(origin + ": " + k.hf + " = " + v->dump() + " disagrees with " +
                    read_from[k.model_key] + " = " + key.show(m) + " (both are " + k.model_key +
                    ")");
      continue;
    }
    key.set(m, node);
    given.insert(k.model_key);
    read_from[k.model_key] = k.hf;
  }
  for (const HfFixed& f : a.fixed)
    if (f.checked && config.contains(f.hf) && config[f.hf] != f.value)
      throw Error(origin + ": " + f.hf + " = " + config[f.hf].dump() + " is not supported: " +
                  "cleave's " + a.architecture + " has " + f.hf + " = " + f.value.dump());
  try {
    resolve_model_config(m, given, origin);
  } catch (const Error& e) {
    throw Error(with_hf_names(e.what(), a));
  }
  if (a.family == Family::llama) {
    const nlohmann::json head_dim = config.value("head_dim", nlohmann::json());
    if (!head_dim.is_null() && head_dim != m.head_dim())
      throw Error(origin + ": head_dim = " + head_dim.dump() + " is not supported: cleave's " +
                  "heads have hidden_size / num_attention_heads = " +
                  std::to_string(m.head_dim()) + " dimensions");
    // A window at least as long as the context never cuts one off.
    const nlohmann::json window = config.value("sliding_window", nlohmann::json());
    if (!window.is_null() && !(window.is_number_integer() && window >= m.max_seq_len))
      throw Error(origin + ": sliding_window = " + window.dump() + " is not supported: cleave's " +
                  "attention has no sliding window (null, or at least max_position_embeddings = " +
                  std::to_string(m.max_seq_len) + ", would do)");
  }
  // What import reads must be what export would write of the same model.
  if (a.model_type != architecture_of(m).model_type)
    throw Error(origin + ": model_type \"" + type + "\" describes a model cleave writes as \"" +
                architecture_of(m).model_type + "\" (" + architecture_of(m).architecture +
                "): rename it so, or change its keys");
  return m;
}

}  // namespace cleave
