#include "cleave/train/config.h"

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <toml++/toml.h>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/base/toml_keys.h"
#include "cleave/model/model_keys.h"
#include "cleave/train/config_rules.h"

namespace cleave {

namespace {

using config_rules::delayed_fp8;
using config_rules::is_fp8;
using config_rules::per_tensor_fp8;

using Key = ConfigKey<Config>;

// A config is a few kilobytes; anything near this is not one.
constexpr int64_t kMaxConfigBytes = 16 * kMiB;

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = [] {
    using C = Config;
    std::vector<Key> k;
    auto data = [&](ConfigKey<DataConfig> key) { k.push_back(nested_key(&C::data, key)); };
    // [train]'s keys are StepOptions' or TrainConfig's own.
    auto train = [&](auto key) { k.push_back(nested_key(&C::train, key)); };
    auto optim = [&](ConfigKey<OptimConfig> key) { k.push_back(nested_key(&C::optim, key)); };
    auto parallel = [&](ConfigKey<ParallelConfig> key) {
      k.push_back(nested_key(&C::parallel, key));
    };
    for (const ConfigKey<ModelConfig>& key : model_keys()) k.push_back(nested_key(&C::model, key));

    data(string_key("data.dir", &DataConfig::dir));
    data(string_key("data.corpus", &DataConfig::corpus));
    data(real_key("data.val_fraction", &DataConfig::val_fraction, 0.0, 0.5));
    data(bool_key("data.document_mask", &DataConfig::document_mask));
    data(bool_key("data.reset_positions", &DataConfig::reset_positions));
    data(integer_key("data.document_separator", &DataConfig::document_separator, 0,
                     (1 << 24) - 1));

    train(integer_key("train.seed", &TrainConfig::seed, 0, 9.2e18));
    train(integer_key("train.seq_len", &TrainConfig::seq_len, 1, 1 << 20));
    train(integer_key("train.micro_batch_size", &TrainConfig::micro_batch_size, 1, 1 << 16));
    train(integer_key("train.grad_accum_steps", &TrainConfig::grad_accum_steps, 1, 1 << 16));
    train(integer_key("train.steps", &TrainConfig::steps, 0, 1e12));
    train(choice_key("train.dtype", &TrainConfig::dtype,
                     std::vector<std::pair<std::string, Precision>>{{"fp32", Precision::fp32},
                                                                    {"bf16", Precision::bf16},
                                                                    {"fp16", Precision::fp16},
                                                                    {"fp8", Precision::fp8}}));
    // FP8 (docs/precision.md#fp8): written only where they apply.
    const std::vector<std::pair<std::string, kernels::Fp8Recipe>> recipes = {
        {"delayed", kernels::Fp8Recipe::delayed}, {"current", kernels::Fp8Recipe::current},
        {"blockwise", kernels::Fp8Recipe::blockwise}, {"mxfp8", kernels::Fp8Recipe::mxfp8}};
    std::vector<std::string> recipe_names;
    for (auto& [name, r] : recipes) recipe_names.push_back(name);
    k.push_back({"train.fp8_recipe", KeyKind::string, 0, 0, recipe_names,
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
    k.push_back({"train.fp8_margin", KeyKind::integer, 0, 64, {},
                 [](C& c, const toml::node& n) { c.train.fp8.margin = int(*n.value<int64_t>()); },
                 [](const C& c) {
                   return per_tensor_fp8(c) ? std::to_string(c.train.fp8.margin) : std::string();
                 }});
    k.push_back({"train.fp8_amax_history_len", KeyKind::integer, 1, 1 << 20, {},
                 [](C& c, const toml::node& n) {
                   c.train.fp8.amax_history_len = *n.value<int64_t>();
                 },
                 [](const C& c) {
                   return delayed_fp8(c) ? std::to_string(c.train.fp8.amax_history_len)
                                         : std::string();
                 }});
    k.push_back({"train.fp8_amax_compute_algo", KeyKind::string, 0, 0, {"max", "most_recent"},
                 [](C& c, const toml::node& n) {
                   c.train.fp8.amax_most_recent = *n.value<std::string>() == "most_recent";
                 },
                 [](const C& c) {
                   if (!delayed_fp8(c)) return std::string();
                   return quote(c.train.fp8.amax_most_recent ? "most_recent" : "max");
                 }});
    // fp16's loss scaler, written only where it applies.
    auto loss_scale = [&](ConfigKey<LossScalerOptions> key) {
      ConfigKey<TrainConfig> in_train = nested_key(&TrainConfig::loss_scale, key);
      in_train.show = [show = in_train.show](const TrainConfig& t) {
        return t.dtype == Precision::fp16 ? show(t) : std::string();
      };
      train(in_train);
    };
    using L = LossScalerOptions;
    loss_scale(real_key("train.loss_scale_initial", &L::initial, 1e-30, 1e30));
    loss_scale(real_key("train.loss_scale_growth_factor", &L::growth_factor, 1.0, 1e6));
    loss_scale(integer_key("train.loss_scale_growth_interval", &L::growth_interval, 1, 1e12));
    loss_scale(real_key("train.loss_scale_backoff_factor", &L::backoff_factor, 1e-6, 1.0));
    loss_scale(integer_key("train.loss_scale_hysteresis", &L::hysteresis, 1, 1e6));
    loss_scale(real_key("train.loss_scale_min", &L::min, 1e-30, 1e30));
    train(integer_key("train.threads", &TrainConfig::threads, 0, 4096));
    train(integer_key("train.log_interval", &TrainConfig::log_interval, 1, 1e12));
    train(integer_key("train.val_interval", &TrainConfig::val_interval, 0, 1e12));
    train(integer_key("train.val_batches", &TrainConfig::val_batches, 1, 1e9));
    train(integer_key("train.loss_chunk", &TrainConfig::loss_chunk, 0, 1e9));
    train(string_key("train.activation_checkpointing", &TrainConfig::activation_checkpointing));
    train(integer_key("train.ac_every", &TrainConfig::ac_every, 1, 1 << 20));
    train(integer_key("train.checkpoint_interval", &TrainConfig::checkpoint_interval, -1, 1e12));
    train(integer_key("train.keep_checkpoints", &TrainConfig::keep_checkpoints, 1, 1e6));
    train(bool_key("train.async_checkpoint", &TrainConfig::async_checkpoint));
    train(bool_key("train.checkpoint_on_signal", &TrainConfig::checkpoint_on_signal));
    train(string_key("train.out_dir", &TrainConfig::out_dir));
    k.push_back({"train.init_from", KeyKind::string, 0, 0, {},
                 [](C& c, const toml::node& n) { c.train.init_from = *n.value<std::string>(); },
                 [](const C& c) {
                   return c.train.init_from.empty() ? std::string() : quote(c.train.init_from);
                 }});
    train(integer_key("train.trace_step", &TrainConfig::trace_step, 0, 1e15));
    train(real_key("train.peak_gflops", &TrainConfig::peak_gflops, 0.0, 1e9));
    train(choice_key("train.mfu_peak", &TrainConfig::mfu_peak,
                     std::vector<std::pair<std::string, MfuPeak>>{{"gemm", MfuPeak::gemm},
                                                                  {"hardware", MfuPeak::hardware}}));

    optim(real_key("optim.lr", &OptimConfig::lr, 0.0, 10.0));
    optim(real_key("optim.min_lr", &OptimConfig::min_lr, 0.0, 10.0));
    optim(integer_key("optim.warmup_steps", &OptimConfig::warmup_steps, 0, 1e12));
    optim(choice_key("optim.decay", &OptimConfig::decay,
                     std::vector<std::pair<std::string, LrDecay>>{{"cosine", LrDecay::cosine},
                                                                  {"linear", LrDecay::linear},
                                                                  {"constant", LrDecay::constant}}));
    optim(real_key("optim.beta1", &OptimConfig::beta1, 0.0, 0.999999));
    optim(real_key("optim.beta2", &OptimConfig::beta2, 0.0, 0.999999999));
    optim(real_key("optim.eps", &OptimConfig::eps, 0.0, 1.0));
    optim(real_key("optim.weight_decay", &OptimConfig::weight_decay, 0.0, 10.0));
    optim(string_key("optim.offload", &OptimConfig::offload));
    k.push_back({"optim.offload_dir", KeyKind::string, 0, 0, {},
                 [](C& c, const toml::node& n) { c.optim.offload_dir = *n.value<std::string>(); },
                 [](const C& c) {
                   const bool offloading =
                       c.optim.offload == "file" || c.parallel.offload_params == "file";
                   return offloading ? quote(c.optim.offload_dir) : std::string();
                 }});
    k.push_back({"optim.no_decay", KeyKind::string_list, 0, 0, {},
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
    optim(real_key("optim.grad_clip", &OptimConfig::grad_clip, 0.0, 1e9));

    parallel(integer_key("parallel.pp", &ParallelConfig::pp, -1, 1 << 20));
    parallel(integer_key("parallel.dp_replicate", &ParallelConfig::dp_replicate, -1, 1 << 20));
    parallel(integer_key("parallel.dp_shard", &ParallelConfig::dp_shard, -1, 1 << 20));
    parallel(integer_key("parallel.cp", &ParallelConfig::cp, -1, 1 << 20));
    parallel(string_key("parallel.cp_mode", &ParallelConfig::cp_mode));
    parallel(integer_key("parallel.cp_ulysses", &ParallelConfig::cp_ulysses, 0, 1 << 20));
    parallel(integer_key("parallel.tp", &ParallelConfig::tp, -1, 1 << 20));
    parallel(integer_key("parallel.ep", &ParallelConfig::ep, 1, 1 << 20));
    parallel(integer_key("parallel.zero_stage", &ParallelConfig::zero_stage, 0, 3));
    parallel(string_key("parallel.pp_schedule", &ParallelConfig::pp_schedule));
    parallel(integer_key("parallel.pp_virtual", &ParallelConfig::pp_virtual, 0, 256));
    k.push_back({"parallel.pp_layers", KeyKind::integer_list, 0, 1 << 20, {},
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
    parallel(string_key("parallel.pp_schedule_csv", &ParallelConfig::pp_schedule_csv));
    parallel(real_key("parallel.bucket_mb", &ParallelConfig::bucket_mb, 0.001, 1e6));
    parallel(string_key("parallel.offload_params", &ParallelConfig::offload_params));
    parallel(real_key("parallel.comm_timeout_s", &ParallelConfig::comm_timeout_s, 0.1, 1e7));
    parallel(string_key("parallel.status_dir", &ParallelConfig::status_dir));
    k.push_back({"parallel.fp8_allgather", KeyKind::boolean, 0, 0, {},
                 [](C& c, const toml::node& n) { c.parallel.fp8_allgather = *n.value<bool>(); },
                 [](const C& c) {
                   return is_fp8(c) ? std::string(c.parallel.fp8_allgather ? "true" : "false")
                                    : std::string();
                 }});
    parallel(bool_key("parallel.sequence_parallel", &ParallelConfig::sequence_parallel));
    parallel(bool_key("parallel.check_placements", &ParallelConfig::check_placements));
    return k;
  }();
  return keys;
}

// Applies "a.b=value" to the parsed table: the value is TOML (42, 1e-3, true, "x", [..]) or a bare
// string (fp32, runs/x).
void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("--set " + assignment + ": expected key=value, e.g. --set train.steps=100");
  const std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  // One key at a time: `--set model={}` would replace the whole table with its defaults.
  if (key.find('.') == std::string::npos)
    throw Error("--set " + assignment + ": " + key + " is a table; set its keys one at a time, " +
                "e.g. --set " + key + ".NAME=VALUE");
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
  if (parsed["v"].is_table())
    throw Error("--set " + assignment + ": " + key + " takes a value, not a table");
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
  toml::table root = parse_toml(text, origin);
  for (auto& o : overrides) apply_override(root, o);
  Config c;
  std::set<std::string> given;
  for (auto& [table_name, table_node] : root) {
    const std::string t(table_name.str());
    if (!table_node.is_table())
      throw Error(toml_where(table_node, origin) + ": unknown key '" + t + "' (did you mean '" +
                  closest_key(t, config_keys()) + "'?)");
    read_table(*table_node.as_table(), t, schema(), c, origin, given);
  }
  config_rules::validate_and_resolve(c, given, origin);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_config(read_bounded_file(path, "config file", kMaxConfigBytes), path, overrides);
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
