#include "cleave/train/config_rules.h"

#include <cstdio>

#include "cleave/base/check.h"

namespace cleave::config_rules {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += char(ch);
    else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else out += char(ch);
  }
  return out + "\"";
}

bool is_fp8(const Config& c) { return c.train.dtype == Precision::fp8; }
bool per_tensor_fp8(const Config& c) {
  return is_fp8(c) && c.train.fp8.per_tensor();
}
bool delayed_fp8(const Config& c) {
  return is_fp8(c) && c.train.fp8.recipe == kernels::Fp8Recipe::delayed;
}

void validate_and_resolve(Config& c, const std::set<std::string>& given, const std::string& origin) {
  auto fail = [&](const std::string& msg) { throw Error(origin + ": " + msg); };
  ModelConfig& m = c.model;
  if (!given.count("model.n_kv_heads")) m.n_kv_heads = m.n_heads;
  if (!given.count("model.tie_embeddings")) m.tie_embeddings = m.family == Family::gpt2;
  if (!given.count("model.ffn_hidden"))  // Llama's 2/3 * 4d, rounded up to a multiple of 32
    m.ffn_hidden = m.family == Family::gpt2 ? 4 * m.d_model : (8 * m.d_model / 3 + 31) / 32 * 32;
  if (!given.count("model.moe_ffn_hidden")) m.moe_ffn_hidden = m.ffn_hidden;
  for (const std::string& key : given)
    if (key.rfind("model.moe_", 0) == 0 && key != "model.moe_experts" && m.moe_experts == 0)
      fail(key + " is set but model.moe_experts = 0: the model has no mixture-of-experts layer");
  if (m.moe_experts > 0) {
    if (m.moe_top_k > m.moe_experts)
      fail("model.moe_top_k = " + std::to_string(m.moe_top_k) + " exceeds model.moe_experts = " +
           std::to_string(m.moe_experts));
    if (m.moe_layers() == 0)
      fail("model.moe_first_dense = " + std::to_string(m.moe_first_dense) +
           " and model.moe_every = " + std::to_string(m.moe_every) + " leave none of the " +
           std::to_string(m.n_layers) + " layers a mixture of experts");
    if (given.count("model.moe_bias_update_rate") && m.moe_router != MoeRouter::sigmoid_bias)
      fail("model.moe_bias_update_rate is set but model.moe_router = \"" +
           std::string(moe_router_name(m.moe_router)) + "\": only sigmoid_bias has a bias");
  }
  if (m.d_model % m.n_heads != 0)
    fail("model.d_model = " + std::to_string(m.d_model) + " is not divisible by model.n_heads = " +
         std::to_string(m.n_heads));
  if (m.n_heads % m.n_kv_heads != 0)
    fail("model.n_heads = " + std::to_string(m.n_heads) +
         " is not divisible by model.n_kv_heads = " + std::to_string(m.n_kv_heads));
  if (m.family == Family::gpt2 && m.n_kv_heads != m.n_heads)
    fail("model.n_kv_heads = " + std::to_string(m.n_kv_heads) +
         ": the gpt2 family has no grouped-query attention; it must equal model.n_heads = " +
         std::to_string(m.n_heads) + " (use family = \"llama\")");
  if (m.family == Family::llama && m.head_dim() % 2 != 0)
    fail("head dimension model.d_model / model.n_heads = " + std::to_string(m.head_dim()) +
         " must be even for rotary embeddings");
  if (c.data.document_separator >= m.vocab_size)
    fail("data.document_separator = " + std::to_string(c.data.document_separator) +
         " is no token id of model.vocab_size = " + std::to_string(m.vocab_size));
  if (c.train.seq_len > m.max_seq_len)
    fail("train.seq_len = " + std::to_string(c.train.seq_len) + " exceeds model.max_seq_len = " +
         std::to_string(m.max_seq_len));
  for (const std::string& key : given) {
    if (key.rfind("train.loss_scale_", 0) == 0 && c.train.dtype != Precision::fp16)
      fail(key + " is set but train.dtype = \"" + precision_name(c.train.dtype) +
           "\": the loss scaler serves fp16 only");
    if (key.rfind("train.fp8_", 0) == 0 && !is_fp8(c))
      fail(key + " is set but train.dtype = \"" + precision_name(c.train.dtype) +
           "\": it serves fp8 only");
    else if (key == "train.fp8_margin" && !per_tensor_fp8(c))
      fail(key + " is set but train.fp8_recipe is a tile recipe, whose scales are powers of two "
           "with no margin");
    else if (key.rfind("train.fp8_amax_", 0) == 0 && !delayed_fp8(c))
      fail(key + " is set but train.fp8_recipe is not \"delayed\": only delayed scaling keeps "
           "an amax history");
  }
  if (c.train.loss_scale.min > c.train.loss_scale.initial)
    fail("train.loss_scale_min = " + show_real(c.train.loss_scale.min) +
         " exceeds train.loss_scale_initial = " + show_real(c.train.loss_scale.initial));
  if (c.optim.offload != "none" && c.optim.offload != "file")
    fail("optim.offload = " + quote(c.optim.offload) + " is not one of \"none\", \"file\"");
  if (c.parallel.offload_params != "none" && c.parallel.offload_params != "file")
    fail("parallel.offload_params = " + quote(c.parallel.offload_params) +
         " is not one of \"none\", \"file\"");
  if (c.parallel.fp8_allgather) {
    if (!per_tensor_fp8(c))
      fail("parallel.fp8_allgather needs train.dtype = \"fp8\" with a per-tensor recipe "
           "(\"delayed\" or \"current\"): a ZeRO-3 shard cuts tiles");
    if (c.parallel.zero_stage != 3)
      fail("parallel.fp8_allgather gathers ZeRO-3's parameters; parallel.zero_stage = " +
           std::to_string(c.parallel.zero_stage));
    if (c.train.fp8.recipe == kernels::Fp8Recipe::current && c.parallel.tp > 1)
      fail("parallel.fp8_allgather with train.fp8_recipe = \"current\" needs parallel.tp = 1: "
           "the gather's scale would miss the other tp ranks' shards of each weight");
  }
  if (c.parallel.offload_params == "file" && c.parallel.zero_stage != 3)
    fail("parallel.offload_params = \"file\" needs parallel.zero_stage = 3 (it is " +
         std::to_string(c.parallel.zero_stage) + "): below it every rank holds whole parameters");
  const bool offloading = c.optim.offload == "file" || c.parallel.offload_params == "file";
  if (!offloading && given.count("optim.offload_dir"))
    fail("optim.offload_dir is set but neither optim.offload nor parallel.offload_params is "
         "\"file\"");
  if (offloading && c.optim.offload_dir.empty()) c.optim.offload_dir = c.train.out_dir;
  if (c.optim.min_lr > c.optim.lr)
    fail("optim.min_lr = " + show_real(c.optim.min_lr) + " exceeds optim.lr = " +
         show_real(c.optim.lr));
}

}  // namespace cleave::config_rules
