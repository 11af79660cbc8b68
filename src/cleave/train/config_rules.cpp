#include "cleave/train/config_rules.h"

#include "cleave/base/check.h"
#include "cleave/base/toml_keys.h"
#include "cleave/model/model_keys.h"

namespace cleave::config_rules {

bool is_fp8(const Config& c) { return c.train.dtype == Precision::fp8; }
bool per_tensor_fp8(const Config& c) {
  return is_fp8(c) && c.train.fp8.per_tensor();
}
bool delayed_fp8(const Config& c) {
  return is_fp8(c) && c.train.fp8.recipe == kernels::Fp8Recipe::delayed;
}

void validate_and_resolve(Config& c, const std::set<std::string>& given, const std::string& origin) {
  auto fail = [&](const std::string& msg) { throw Error(origin + ": " + msg); };
  resolve_model_config(c.model, given, origin);
  const ModelConfig& m = c.model;
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
