#include "cleave/train/config.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <toml++/toml.h>

#include "cleave/base/check.h"
#include "cleave/train/config_rules.h"

namespace cleave {

namespace {

using config_rules::delayed_fp8;
using config_rules::is_fp8;
using config_rules::per_tensor_fp8;
using config_rules::quote;
using config_rules::show_real;

enum class Kind { integer, real, boolean, string, string_list, integer_list };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::integer: return "an integer";
    case Kind::real: return "a number";
    case Kind::boolean: return "a boolean";
    case Kind::string: return "a string";
    case Kind::string_list: return "an array of strings";
    case Kind::integer_list: return "an array of integers";
  }
  return "?";
}

// One key of the schema: its type, its allowed range or choices, and how it reads and writes the
// Config. Values arrive type-checked and range-checked.
struct Key {
  std::string name;
  Kind kind;
  double min = 0, max = 0;
  std::vector<std::string> choices;
  std::function<void(Config&, const toml::node&)> set;
  // As a TOML literal; "" for a key that does not apply to this config (to_toml leaves it out).
  std::function<std::string(const Config&)> show;
};

// A bound in a message: short, not round-trip exact.
std::string show_bound(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

template <class T>
Key integer_key(std::string name, T Config::*section, auto field, double min, double max) {
  return {name, Kind::integer, min, max, {},
          [=](Config& c, const toml::node& n) { (c.*section).*field = *n.value<int64_t>(); },
          [=](const Config& c) { return std::to_string((c.*section).*field); }};
}

template <class T>
Key real_key(std::string name, T Config::*section, auto field, double min, double max) {
  return {name, Kind::real, min, max, {},
          [=](Config& c, const toml::node& n) { (c.*section).*field = *n.value<double>(); },
          [=](const Config& c) { return show_real((c.*section).*field); }};
}

template <class T, class U>
Key string_key(std::string name, T Config::*section, std::string U::*field) {
  return {name, Kind::string, 0, 0, {},
          [=](Config& c, const toml::node& n) { (c.*section).*field = *n.value<std::string>(); },
          [=](const Config& c) { return quote((c.*section).*field); }};
}

// A key of the loss scaler's options, train.loss_scale_<suffix>.
template <class V>
Key loss_scale_key(const std::string& suffix, V LossScalerOptions::*field, double min, double max) {
  constexpr bool integer = std::is_integral_v<V>;
  return {"train.loss_scale_" + suffix, integer ? Kind::integer : Kind::real, min, max, {},
          [=](Config& c, const toml::node& n) {
            if constexpr (integer)
              c.train.loss_scale.*field = V(*n.value<int64_t>());
            else
              c.train.loss_scale.*field = *n.value<double>();
          },
          [=](const Config& c) {
            if (c.train.dtype != Precision::fp16) return std::string();
            if constexpr (integer)
              return std::to_string(c.train.loss_scale.*field);
            else
              return show_real(c.train.loss_scale.*field);
          }};
}

// A string key that selects one of a fixed set of values of an enum.
template <class T, class U, class E>
Key choice_key(std::string name, T Config::*section, E U::*field,
               std::vector<std::pair<std::string, E>> options) {
  std::vector<std::string> choices;
  for (auto& [s, e] : options) choices.push_back(s);
  return {name, Kind::string, 0, 0, choices,
          [=](Config& c, const toml::node& n) {
            const std::string v = *n.value<std::string>();
            for (auto& [s, e] : options)
              if (s == v) (c.*section).*field = e;
          },
          [=](const Config& c) {
            for (auto& [s, e] : options)
              if ((c.*section).*field == e) return quote(s);
            return std::string("\"?\"");
          }};
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    using C = Config;
    std::vector<Key> k;
    k.push_back(choice_key("model.family", &C::model, &ModelConfig::family,
                           std::vector<std::pair<std::string, Family>>{{"gpt2", Family::gpt2},
                                                                       {"llama", Family::llama}}));
    k.push_back(integer_key("model.vocab_size", &C::model, &ModelConfig::vocab_size, 2, 1 << 24));
    k.push_back(integer_key("model.d_model", &C::model, &ModelConfig::d_model, 2, 1 << 16));
    k.push_back(integer_key("model.n_layers", &C::model, &ModelConfig::n_layers, 1, 1024));
    k.push_back(integer_key("model.n_heads", &C::model, &ModelConfig::n_heads, 1, 1024));
    k.push_back(integer_key("model.n_kv_heads", &C::model, &ModelConfig::n_kv_heads, 1, 1024));
    k.push_back(integer_key("model.ffn_hidden", &C::model, &ModelConfig::ffn_hidden, 1, 1 << 20));
    k.push_back(integer_key("model.max_seq_len", &C::model, &ModelConfig::max_seq_len, 2, 1 << 20));
    k.push_back(real_key("model.norm_eps", &C::model, &ModelConfig::norm_eps, 1e-12, 1.0));
    k.push_back(real_key("model.rope_theta", &C::model, &ModelConfig::rope_theta, 1.0, 1e9));
    k.push_back({"model.tie_embeddings", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.model.tie_embeddings = *n.value<bool>(); },
                 [](const C& c) { return std::string(c.model.tie_embeddings ? "true" : "false"); }});
    k.push_back(real_key("model.init_std", &C::model, &ModelConfig::init_std, 0.0, 10.0));
    // The mixture-of-experts keys appear in a written config only for a MoE model; the router's
    // bias rate only for sigmoid_bias.
    auto moe = [](Key key, bool bias_only = false) {
      key.show = [show = key.show, bias_only](const C& c) {
        const bool applies = c.model.moe_experts > 0 &&
                             (!bias_only || c.model.moe_router == MoeRouter::sigmoid_bias);
        return applies ? show(c) : std::string();
      };
      return key;
    };
    k.push_back(integer_key("model.moe_experts", &C::model, &ModelConfig::moe_experts, 0, 1 << 16));
    k.push_back(moe(integer_key("model.moe_top_k", &C::model, &ModelConfig::moe_top_k, 1, 1 << 16)));
    k.push_back(moe(integer_key("model.moe_shared_experts", &C::model,
                                &ModelConfig::moe_shared_experts, 0, 1 << 10)));
    k.push_back(moe(integer_key("model.moe_ffn_hidden", &C::model, &ModelConfig::moe_ffn_hidden, 1,
                                1 << 20)));
    k.push_back(moe(integer_key("model.moe_every", &C::model, &ModelConfig::moe_every, 1, 1024)));
    k.push_back(moe(integer_key("model.moe_first_dense", &C::model, &ModelConfig::moe_first_dense,
                                0, 1024)));
    k.push_back(moe(choice_key("model.moe_router", &C::model, &ModelConfig::moe_router,
                               std::vector<std::pair<std::string, MoeRouter>>{
                                   {"topk_softmax", MoeRouter::topk_softmax},
                                   {"softmax_topk", MoeRouter::softmax_topk},
                                   {"sigmoid_bias", MoeRouter::sigmoid_bias}})));
    k.push_back(moe(real_key("model.moe_aux_loss_coef", &C::model, &ModelConfig::moe_aux_loss_coef,
                             0.0, 1e3)));
    k.push_back(moe(real_key("model.moe_z_loss_coef", &C::model, &ModelConfig::moe_z_loss_coef, 0.0,
                             1e3)));
    k.push_back(moe(real_key("model.moe_bias_update_rate", &C::model,
                             &ModelConfig::moe_bias_update_rate, 0.0, 1.0),
                    true));
    k.push_back(moe(real_key("model.moe_capacity_factor", &C::model,
                             &ModelConfig::moe_capacity_factor, 0.0, 1e3)));

    k.push_back(string_key("data.dir", &C::data, &DataConfig::dir));
    k.push_back(string_key("data.corpus", &C::data, &DataConfig::corpus));
    k.push_back(real_key("data.val_fraction", &C::data, &DataConfig::val_fraction, 0.0, 0.5));
    k.push_back({"data.document_mask", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.data.document_mask = *n.value<bool>(); },
                 [](const C& c) { return std::string(c.data.document_mask ? "true" : "false"); }});
    k.push_back({"data.reset_positions", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.data.reset_positions = *n.value<bool>(); },
                 [](const C& c) { return std::string(c.data.reset_positions ? "true" : "false"); }});
    k.push_back(integer_key("data.document_separator", &C::data, &DataConfig::document_separator,
                            0, (1 << 24) - 1));

    k.push_back(integer_key("train.seed", &C::train, &TrainConfig::seed, 0, 9.2e18));
    k.push_back(integer_key("train.seq_len", &C::train, &TrainConfig::seq_len, 1, 1 << 20));
    k.push_back(integer_key("train.micro_batch_size", &C::train, &TrainConfig::micro_batch_size,
                            1, 1 << 16));
    k.push_back(integer_key("train.grad_accum_steps", &C::train, &TrainConfig::grad_accum_steps,
                            1, 1 << 16));
    k.push_back(integer_key("train.steps", &C::train, &TrainConfig::steps, 0, 1e12));
    k.push_back(choice_key("train.dtype", &C::train, &TrainConfig::dtype,
                           std::vector<std::pair<std::string, Precision>>{
                               {"fp32", Precision::fp32},
                               {"bf16", Precision::bf16},
                               {"fp16", Precision::fp16},
                               {"fp8", Precision::fp8}}));
    // FP8 (docs/precision.md#fp8): written only where they apply.
    const std::vector<std::pair<std::string, kernels::Fp8Recipe>> recipes = {
        {"delayed", kernels::Fp8Recipe::delayed}, {"current", kernels::Fp8Recipe::current},
        {"blockwise", kernels::Fp8Recipe::blockwise}, {"mxfp8", kernels::Fp8Recipe::mxfp8}};
    std::vector<std::string> recipe_names;
    for (auto& [name, r] : recipes) recipe_names.push_back(name);
    k.push_back({"train.fp8_recipe", Kind::string, 0, 0, recipe_names,
                 [=](C& c, const toml::node& n) {
                   for (auto& [name, r] : recipes)
                     if (name == *n.value<std::string>()) c.train.fp8.recipe = r;
                 },
                 [=](const C& c) {
                   if (!is_fp8(c)) return std::string();
                   for (auto& [name, r] : recipes)
                     if (r == c.train.fp8.recipe) return quote(name);
                   return std::string("\"?\"");
                 }});
    k.push_back({"train.fp8_margin", Kind::integer, 0, 64, {},
                 [](C& c, const toml::node& n) { c.train.fp8.margin = int(*n.value<int64_t>()); },
                 [](const C& c) {
                   return per_tensor_fp8(c) ? std::to_string(c.train.fp8.margin) : std::string();
                 }});
    k.push_back({"train.fp8_amax_history_len", Kind::integer, 1, 1 << 20, {},
                 [](C& c, const toml::node& n) {
                   c.train.fp8.amax_history_len = *n.value<int64_t>();
                 },
                 [](const C& c) {
                   return delayed_fp8(c) ? std::to_string(c.train.fp8.amax_history_len)
                                         : std::string();
                 }});
    k.push_back({"train.fp8_amax_compute_algo", Kind::string, 0, 0, {"max", "most_recent"},
                 [](C& c, const toml::node& n) {
                   c.train.fp8.amax_most_recent = *n.value<std::string>() == "most_recent";
                 },
                 [](const C& c) {
                   if (!delayed_fp8(c)) return std::string();
                   return quote(c.train.fp8.amax_most_recent ? "most_recent" : "max");
                 }});
    k.push_back(loss_scale_key("initial", &LossScalerOptions::initial, 1e-30, 1e30));
    k.push_back(loss_scale_key("growth_factor", &LossScalerOptions::growth_factor, 1.0, 1e6));
    k.push_back(loss_scale_key("growth_interval", &LossScalerOptions::growth_interval, 1, 1e12));
    k.push_back(loss_scale_key("backoff_factor", &LossScalerOptions::backoff_factor, 1e-6, 1.0));
    k.push_back(loss_scale_key("hysteresis", &LossScalerOptions::hysteresis, 1, 1e6));
    k.push_back(loss_scale_key("min", &LossScalerOptions::min, 1e-30, 1e30));
    k.push_back(integer_key("train.threads", &C::train, &TrainConfig::threads, 0, 4096));
    k.push_back(integer_key("train.log_interval", &C::train, &TrainConfig::log_interval, 1, 1e12));
    k.push_back(integer_key("train.val_interval", &C::train, &TrainConfig::val_interval, 0, 1e12));
    k.push_back(integer_key("train.val_batches", &C::train, &TrainConfig::val_batches, 1, 1e9));
    k.push_back(integer_key("train.loss_chunk", &C::train, &TrainConfig::loss_chunk, 0, 1e9));
    k.push_back(string_key("train.activation_checkpointing", &C::train,
                           &TrainConfig::activation_checkpointing));
    k.push_back(integer_key("train.ac_every", &C::train, &TrainConfig::ac_every, 1, 1 << 20));
    k.push_back(integer_key("train.checkpoint_interval", &C::train,
                            &TrainConfig::checkpoint_interval, -1, 1e12));
    k.push_back(integer_key("train.keep_checkpoints", &C::train, &TrainConfig::keep_checkpoints,
                            1, 1e6));
    k.push_back(string_key("train.out_dir", &C::train, &TrainConfig::out_dir));
    k.push_back(integer_key("train.trace_step", &C::train, &TrainConfig::trace_step, 0, 1e15));
    k.push_back(real_key("train.peak_gflops", &C::train, &TrainConfig::peak_gflops, 0.0, 1e9));
    k.push_back(choice_key("train.mfu_peak", &C::train, &TrainConfig::mfu_peak,
                           std::vector<std::pair<std::string, MfuPeak>>{
                               {"gemm", MfuPeak::gemm}, {"hardware", MfuPeak::hardware}}));

    k.push_back(real_key("optim.lr", &C::optim, &OptimConfig::lr, 0.0, 10.0));
    k.push_back(real_key("optim.min_lr", &C::optim, &OptimConfig::min_lr, 0.0, 10.0));
    k.push_back(integer_key("optim.warmup_steps", &C::optim, &OptimConfig::warmup_steps, 0, 1e12));
    k.push_back(choice_key("optim.decay", &C::optim, &OptimConfig::decay,
                           std::vector<std::pair<std::string, LrDecay>>{
                               {"cosine", LrDecay::cosine},
                               {"linear", LrDecay::linear},
                               {"constant", LrDecay::constant}}));
    k.push_back(real_key("optim.beta1", &C::optim, &OptimConfig::beta1, 0.0, 0.999999));
    k.push_back(real_key("optim.beta2", &C::optim, &OptimConfig::beta2, 0.0, 0.999999999));
    k.push_back(real_key("optim.eps", &C::optim, &OptimConfig::eps, 0.0, 1.0));
    k.push_back(real_key("optim.weight_decay", &C::optim, &OptimConfig::weight_decay, 0.0, 10.0));
    k.push_back(string_key("optim.offload", &C::optim, &OptimConfig::offload));
    k.push_back({"optim.offload_dir", Kind::string, 0, 0, {},
                 [](C& c, const toml::node& n) { c.optim.offload_dir = *n.value<std::string>(); },
                 [](const C& c) {
                   const bool offloading =
                       c.optim.offload == "file" || c.parallel.offload_params == "file";
                   return offloading ? quote(c.optim.offload_dir) : std::string();
                 }});
    k.push_back({"optim.no_decay", Kind::string_list, 0, 0, {},
                 [](C& c, const toml::node& n) {
                   c.optim.no_decay.clear();
                   for (auto& e : *n.as_array()) c.optim.no_decay.push_back(*e.value<std::string>());
                 },
                 [](const C& c) {
                   std::string s = "[";
                   for (size_t i = 0; i < c.optim.no_decay.size(); ++i)
                     s += (i ? ", " : "") + quote(c.optim.no_decay[i]);
                   return s + "]";
                 }});
    k.push_back(real_key("optim.grad_clip", &C::optim, &OptimConfig::grad_clip, 0.0, 1e9));

    k.push_back(integer_key("parallel.pp", &C::parallel, &ParallelConfig::pp, -1, 1 << 20));
    k.push_back(integer_key("parallel.dp_replicate", &C::parallel, &ParallelConfig::dp_replicate,
                            -1, 1 << 20));
    k.push_back(integer_key("parallel.dp_shard", &C::parallel, &ParallelConfig::dp_shard, -1,
                            1 << 20));
    k.push_back(integer_key("parallel.cp", &C::parallel, &ParallelConfig::cp, -1, 1 << 20));
    k.push_back(string_key("parallel.cp_mode", &C::parallel, &ParallelConfig::cp_mode));
    k.push_back(integer_key("parallel.cp_ulysses", &C::parallel, &ParallelConfig::cp_ulysses, 0,
                            1 << 20));
    k.push_back(integer_key("parallel.tp", &C::parallel, &ParallelConfig::tp, -1, 1 << 20));
    k.push_back(integer_key("parallel.ep", &C::parallel, &ParallelConfig::ep, 1, 1 << 20));
    k.push_back(integer_key("parallel.zero_stage", &C::parallel, &ParallelConfig::zero_stage, 0, 3));
    k.push_back(string_key("parallel.pp_schedule", &C::parallel, &ParallelConfig::pp_schedule));
    k.push_back(integer_key("parallel.pp_virtual", &C::parallel, &ParallelConfig::pp_virtual, 0, 256));
    k.push_back({"parallel.pp_layers", Kind::integer_list, 0, 0, {},
                 [](C& c, const toml::node& n) {
                   c.parallel.pp_layers.clear();
                   for (auto& e : *n.as_array()) c.parallel.pp_layers.push_back(int(*e.value<int64_t>()));
                 },
                 [](const C& c) {
                   std::string s = "[";
                   for (size_t i = 0; i < c.parallel.pp_layers.size(); ++i)
                     s += (i ? ", " : "") + std::to_string(c.parallel.pp_layers[i]);
                   return s + "]";
                 }});
    k.push_back(string_key("parallel.pp_schedule_csv", &C::parallel, &ParallelConfig::pp_schedule_csv));
    k.push_back(real_key("parallel.bucket_mb", &C::parallel, &ParallelConfig::bucket_mb, 0.001, 1e6));
    k.push_back(string_key("parallel.offload_params", &C::parallel, &ParallelConfig::offload_params));
    k.push_back(real_key("parallel.comm_timeout_s", &C::parallel, &ParallelConfig::comm_timeout_s,
                         0.1, 1e7));
    k.push_back(string_key("parallel.status_dir", &C::parallel, &ParallelConfig::status_dir));
    k.push_back({"parallel.fp8_allgather", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.parallel.fp8_allgather = *n.value<bool>(); },
                 [](const C& c) {
                   return is_fp8(c) ? std::string(c.parallel.fp8_allgather ? "true" : "false")
                                    : std::string();
                 }});
    k.push_back({"parallel.sequence_parallel", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.parallel.sequence_parallel = *n.value<bool>(); },
                 [](const C& c) {
                   return std::string(c.parallel.sequence_parallel ? "true" : "false");
                 }});
    k.push_back({"parallel.check_placements", Kind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.parallel.check_placements = *n.value<bool>(); },
                 [](const C& c) {
                   return std::string(c.parallel.check_placements ? "true" : "false");
                 }});
    return k;
  }();
  return keys;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  const std::string leaf = key.substr(key.rfind('.') + 1);
  for (auto& k : schema()) {
    // A key placed in the wrong table is found by its last component as well.
    const std::string k_leaf = k.name.substr(k.name.find('.') + 1);
    const size_t d = std::min(edit_distance(key, k.name), edit_distance(leaf, k_leaf) + 1);
    if (d < best_d) best_d = d, best = k.name;
  }
  return best;
}

std::string where(const toml::node& n, const std::string& origin) {
  const auto& src = n.source();
  return src.begin.line ? origin + ":" + std::to_string(src.begin.line) : origin;
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  os << n.type() << " ";
  if (n.is_table()) os << "{...}";
  else if (n.is_array()) os << *n.as_array();
  else n.visit([&](auto&& v) { os << v; });
  return os.str();
}

bool type_matches(Kind kind, const toml::node& n) {
  switch (kind) {
    case Kind::integer: return n.is_integer();
    case Kind::real: return n.is_floating_point() || n.is_integer();
    case Kind::boolean: return n.is_boolean();
    case Kind::string: return n.is_string();
    case Kind::string_list: {
      if (!n.is_array()) return false;
      for (auto& e : *n.as_array())
        if (!e.is_string()) return false;
      return true;
    }
    case Kind::integer_list: {
      if (!n.is_array()) return false;
      for (auto& e : *n.as_array())
        if (!e.is_integer()) return false;
      return true;
    }
  }
  return false;
}

// Applies "a.b=value" to the parsed table: the value is TOML (42, 1e-3, true, "x", [..]) or a bare
// string (fp32, runs/x).
void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("--set " + assignment + ": expected key=value, e.g. --set train.steps=100");
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text, "--set " + key);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", text}};
  }
  toml::table* table = &root;
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string part = key.substr(start, dot - start);
    if (!table->contains(part)) table->insert(part, toml::table{});
    table = (*table)[part].as_table();
    if (!table) throw Error("--set " + key + ": " + part + " is not a table");
  }
  table->insert_or_assign(key.substr(start), *parsed["v"].node());
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (auto& k : schema()) names.push_back(k.name);
  return names;
}

Config parse_config(const std::string& text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ": TOML syntax error: " << e.description();
    throw Error(os.str());
  }
  for (auto& o : overrides) apply_override(root, o);

  std::map<std::string, const Key*> by_name;
  for (auto& k : schema()) by_name[k.name] = &k;

  Config c;
  std::set<std::string> given;
  for (auto& [table_name, table_node] : root) {
    const std::string t(table_name.str());
    if (!table_node.is_table())
      throw Error(where(table_node, origin) + ": unknown key '" + t + "' (did you mean '" +
                  closest_key(t) + "'?)");
    for (auto& [key_name, node] : *table_node.as_table()) {
      const std::string name = t + "." + std::string(key_name.str());
      auto it = by_name.find(name);
      if (it == by_name.end())
        throw Error(where(node, origin) + ": unknown key '" + name + "' (did you mean '" +
                    closest_key(name) + "'?)");
      const Key& key = *it->second;
      if (!type_matches(key.kind, node))
        throw Error(where(node, origin) + ": " + name + " must be " + kind_name(key.kind) +
                    ", got " + describe(node));
      if (key.kind == Kind::integer || key.kind == Kind::real) {
        const double v = node.is_integer() ? double(*node.value<int64_t>()) : *node.value<double>();
        if (!(v >= key.min && v <= key.max))
          throw Error(where(node, origin) + ": " + name + " = " + describe(node).substr(
                          describe(node).find(' ') + 1) + " is out of range [" +
                      show_bound(key.min) + ", " + show_bound(key.max) + "]");
      }
      if (!key.choices.empty()) {
        const std::string v = *node.value<std::string>();
        if (std::find(key.choices.begin(), key.choices.end(), v) == key.choices.end()) {
          std::string list;
          for (auto& ch : key.choices) list += (list.empty() ? "" : ", ") + quote(ch);
          throw Error(where(node, origin) + ": " + name + " = " + quote(v) + " is not one of " +
                      list);
        }
      }
      key.set(c, node);
      given.insert(name);
    }
  }
  config_rules::validate_and_resolve(c, given, origin);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

std::string to_toml(const Config& c) {
  std::string out, table;
  for (auto& k : schema()) {
    const std::string t = k.name.substr(0, k.name.find('.'));
    if (t != table) out += (table.empty() ? "[" : "\n[") + t + "]\n", table = t;
    const std::string value = k.show(c);
    if (!value.empty()) out += k.name.substr(t.size() + 1) + " = " + value + "\n";
  }
  return out;
}

}  // namespace cleave
