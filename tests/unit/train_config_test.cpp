// The config: every key validated, errors name the key and suggest the closest; overrides; the
// resolved config round-trips through its TOML form.
#include <gtest/gtest.h>

#include "cleave/base/check.h"
#include "cleave/train/config.h"

namespace cleave {
namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "test.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsResolvePerFamily) {
  const Config g = parse_config("[model]\nfamily = \"gpt2\"\nd_model = 64\nn_heads = 4\n", "t");
  EXPECT_EQ(g.model.ffn_hidden, 256);
  EXPECT_TRUE(g.model.tie_embeddings);
  EXPECT_EQ(g.model.n_kv_heads, 4);
  const Config l = parse_config("[model]\nfamily = \"llama\"\nd_model = 96\nn_heads = 4\n", "t");
  EXPECT_EQ(l.model.ffn_hidden, 256);  // 8 * 96 / 3 = 256, a multiple of 32
  EXPECT_FALSE(l.model.tie_embeddings);
}

TEST(Config, UnknownKeySuggestsClosest) {
  EXPECT_EQ(error_of("[train]\nsteps = 3\nmicro_bach_size = 2\n"),
            "test.toml:3: unknown key 'train.micro_bach_size' (did you mean 'train.micro_batch_size'?)");
  EXPECT_NE(error_of("[model]\nlr = 1\n").find("did you mean 'optim.lr'?"), std::string::npos);
  EXPECT_NE(error_of("[trian]\nsteps = 1\n").find("unknown key 'trian.steps'"), std::string::npos);
  EXPECT_NE(error_of("steps = 1\n").find("unknown key 'steps'"), std::string::npos);
}

TEST(Config, WrongTypeAndRange) {
  EXPECT_NE(error_of("[model]\nd_model = \"x\"\n").find("test.toml:2: model.d_model must be an integer, got string"),
            std::string::npos);
  EXPECT_NE(error_of("[optim]\nlr = true\n").find("optim.lr must be a number, got boolean"), std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = -1\n").find("train.steps = -1 is out of range"), std::string::npos);
  EXPECT_NE(error_of("[optim]\nno_decay = [1]\n").find("optim.no_decay must be an array of strings"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\ndtype = \"fp64\"\n").find("is not one of \"fp32\", \"bf16\", \"fp16\""),
            std::string::npos);
  EXPECT_NE(error_of("[parallel]\noffload_params = \"file\"\nzero_stage = 2\n")
                .find("parallel.offload_params = \"file\" needs parallel.zero_stage = 3 (it is 2)"),
            std::string::npos);
}

TEST(Config, CrossKeyRules) {
  EXPECT_NE(error_of("[model]\nd_model = 10\nn_heads = 4\n").find("not divisible by model.n_heads = 4"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nfamily = \"llama\"\nd_model = 64\nn_heads = 4\nn_kv_heads = 3\n")
                .find("model.n_heads = 4 is not divisible by model.n_kv_heads = 3"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nd_model = 64\nn_heads = 4\nn_kv_heads = 2\n").find("no grouped-query"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nmax_seq_len = 64\n[train]\nseq_len = 128\n").find("exceeds model.max_seq_len"),
            std::string::npos);
  EXPECT_NE(error_of("[optim]\nlr = 1e-4\nmin_lr = 1e-3\n").find("exceeds optim.lr"), std::string::npos);
  EXPECT_NE(error_of("[model]\nd_model = 64\n[[broken\n").find("TOML syntax error"), std::string::npos);
}

TEST(Config, Overrides) {
  const Config c = parse_config("[train]\nsteps = 3\n", "t",
                                {"train.steps=7", "train.dtype=bf16", "optim.no_decay=[\"wpe\"]",
                                 "train.out_dir=runs/x", "model.norm_eps=1e-6",
                                 "parallel.status_dir=/shared/cleave-status"});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.dtype, Precision::bf16);
  EXPECT_EQ(c.optim.no_decay, std::vector<std::string>{"wpe"});
  EXPECT_EQ(c.train.out_dir, "runs/x");
  EXPECT_EQ(c.parallel.status_dir, "/shared/cleave-status");
  EXPECT_EQ(parse_config("", "t").parallel.status_dir, "");  // default: /tmp, chosen by the comm layer
  EXPECT_FLOAT_EQ(c.model.norm_eps, 1e-6f);
  EXPECT_NE(error_of("", {"train.stepz=3"}).find("did you mean 'train.steps'?"), std::string::npos);
  EXPECT_NE(error_of("", {"train.steps"}).find("expected key=value"), std::string::npos);
}

TEST(Config, ResolvedTomlRoundTrips) {
  // fp16, offloading and a sigmoid-routed mixture of experts, then fp8 with delayed scaling and
  // ZeRO-3's FP8 gathers, so that every key applies in one of them and is written.
  const Config c = parse_config("[model]\nfamily = \"llama\"\nd_model = 96\nn_heads = 6\nn_kv_heads = 2\n"
                                "moe_experts = 4\nmoe_router = \"sigmoid_bias\"\n"
                                "[train]\ndtype = \"fp16\"\nout_dir = \"runs/x\"\ninit_from = \"runs/base\"\n"
                                "[optim]\nno_decay = [\"embed\"]\ndecay = \"linear\"\n"
                                "offload = \"file\"\n",
                                "t");
  const std::string once = to_toml(c);
  EXPECT_EQ(to_toml(parse_config(once, "resolved")), once);
  const std::string fp8 = to_toml(parse_config(
      "[train]\ndtype = \"fp8\"\n[parallel]\nzero_stage = 3\nfp8_allgather = true\n", "t"));
  EXPECT_EQ(to_toml(parse_config(fp8, "resolved")), fp8);
  for (const std::string& key : config_keys()) {
    const std::string written = key.substr(key.find('.') + 1) + " = ";
    EXPECT_TRUE(once.find(written) != std::string::npos || fp8.find(written) != std::string::npos)
        << key;
  }
  EXPECT_NE(once.find("offload_dir = \"runs/x\""), std::string::npos) << "the default folder";
  // Keys that do not apply are left out, so the written config parses back.
  const std::string plain = to_toml(parse_config("", "t"));
  EXPECT_EQ(plain.find("loss_scale_"), std::string::npos);
  EXPECT_EQ(plain.find("offload_dir"), std::string::npos);
  EXPECT_EQ(plain.find("moe_top_k"), std::string::npos);
  EXPECT_EQ(plain.find("fp8_"), std::string::npos);
  EXPECT_EQ(plain.find("init_from"), std::string::npos);
  EXPECT_EQ(to_toml(parse_config(plain, "resolved")), plain);
}

TEST(Config, MoeKeysNameTheirNumbers) {
  EXPECT_NE(error_of("[model]\nmoe_experts = 4\nmoe_top_k = 5\n")
                .find("model.moe_top_k = 5 exceeds model.moe_experts = 4"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nmoe_top_k = 2\n")
                .find("model.moe_top_k is set but model.moe_experts = 0"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nmoe_experts = 4\nmoe_bias_update_rate = 0.01\n")
                .find("model.moe_bias_update_rate is set but model.moe_router = \"topk_softmax\""),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nn_layers = 2\nmoe_experts = 4\nmoe_first_dense = 2\n")
                .find("leave none of the 2 layers a mixture of experts"),
            std::string::npos);
  const Config c = parse_config("[model]\nmoe_experts = 8\nmoe_every = 2\nmoe_first_dense = 1\n", "t");
  EXPECT_EQ(c.model.moe_ffn_hidden, c.model.ffn_hidden);
  EXPECT_FALSE(c.model.is_moe_layer(0));
  EXPECT_FALSE(c.model.is_moe_layer(1));
  EXPECT_TRUE(c.model.is_moe_layer(2));
  EXPECT_FALSE(c.model.is_moe_layer(3));
}

TEST(Config, PrecisionAndOffloadKeysNeedTheirMode) {
  EXPECT_NE(error_of("[train]\nloss_scale_min = 2.0\n")
                .find("train.loss_scale_min is set but train.dtype = \"fp32\": the loss scaler "
                      "serves fp16 only"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\ndtype = \"fp16\"\nloss_scale_initial = 4.0\nloss_scale_min = 8.0\n")
                .find("train.loss_scale_min = 8.0 exceeds train.loss_scale_initial = 4.0"),
            std::string::npos);
  EXPECT_NE(error_of("[optim]\noffload_dir = \"/x\"\n")
                .find("optim.offload_dir is set but neither optim.offload nor "
                      "parallel.offload_params is \"file\""),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nfp8_recipe = \"current\"\n")
                .find("train.fp8_recipe is set but train.dtype = \"fp32\": it serves fp8 only"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\ndtype = \"fp8\"\n[parallel]\nfp8_allgather = true\n")
                .find("parallel.fp8_allgather gathers ZeRO-3's parameters; parallel.zero_stage = 0"),
            std::string::npos);
  EXPECT_NE(error_of("[parallel]\noffload_params = \"file\"\nzero_stage = 2\n")
                .find("parallel.offload_params = \"file\" needs parallel.zero_stage = 3 (it is 2)"),
            std::string::npos);
}

}  // namespace
}  // namespace cleave
