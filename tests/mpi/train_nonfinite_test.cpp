// A non-finite gradient on one rank, under a finite loss, stops every rank before the update:
// the error names the step and the first tensor whose gradient is non-finite, the parameters are
// those of the step before, and no checkpoint of the poisoned step is written. For DDP (the
// all-reduce spreads the NaN to every rank's copy) and ZeRO-2 (it lands in one rank's shard).
// In fp16 the same overflow skips the step on every rank instead: parameters and optimizer state
// stay those of the step before, the loss scale falls, and it grows again after its interval.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "cleave/data/tokens.h"
#include <nlohmann/json.hpp>

#include "cleave/train/trainer.h"

namespace fs = std::filesystem;

namespace cleave {
namespace {

// A folder rank 0 makes, known to every rank; the token shards of a tiny corpus inside it.
std::string shared_folder() {
  char path[256] = {};
  if (test::world().rank() == 0) {
    std::snprintf(path, sizeof path, "%s/cleave-nonfinite-XXXXXX", fs::temp_directory_path().c_str());
    if (!mkdtemp(path)) std::abort();
    std::vector<uint32_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t((i * 7 + i / 5) % 64);
    write_token_shard(std::string(path) + "/train.bin", tokens, 64);
    write_token_shard(std::string(path) + "/val.bin", tokens, 64);
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

Config tiny_config(const std::string& dir, int zero_stage) {
  Config c;
  c.model.vocab_size = 64;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 2;
  c.model.n_kv_heads = 2;
  c.model.ffn_hidden = 128;
  c.model.max_seq_len = 16;
  c.data.dir = dir;
  c.train.seq_len = 16;
  c.train.micro_batch_size = 2 * test::world().size();
  c.train.steps = 5;
  c.train.threads = 1;
  c.train.log_interval = 1;
  c.train.val_interval = 0;
  c.train.checkpoint_interval = 1;
  c.train.keep_checkpoints = 10;
  c.train.out_dir = dir + "/run-zero" + std::to_string(zero_stage);
  c.train.peak_gflops = 1;
  c.parallel.dp_shard = test::world().size();
  c.parallel.zero_stage = zero_stage;
  c.parallel.comm_timeout_s = 60;
  return c;
}

void expect_stop_before_update(int zero_stage, bool ep = false) {
  const std::string dir = shared_folder();
  Config cfg = tiny_config(dir, zero_stage);
  // Under ep each rank holds two experts of its own: rank 1's first local expert is global
  // expert 2, whose gradient no other rank sees, and the report must name it so.
  if (ep) {
    cfg.model.moe_experts = 2 * test::world().size();
    cfg.model.moe_ffn_hidden = 32;
    cfg.parallel.ep = test::world().size();
  }
  Trainer trainer(cfg, "");
  const std::string poisoned = ep ? "blocks.1.moe.experts.2.fc.weight" : "blocks.1.mlp.fc.weight";
  // Step index 2 (the third step), block 1 (unit 2), on rank 1 only, before the reduction.
  trainer.inject_gradient_fault([&](int64_t step, int unit, ParamStore& params) {
    if (step == 2 && unit == 2 && test::world().rank() == 1)
      params.grad(params.find(poisoned))[5] = std::numeric_limits<float>::quiet_NaN();
  });
  std::string message;
  try {
    trainer.run();
  } catch (const EveryRankError& e) {  // every rank stops alike: reported once
    message = e.what();
  }
  EXPECT_NE(message.find("step 3: "), std::string::npos) << message;
  EXPECT_NE(message.find("gradient norm nan"), std::string::npos) << message;
  EXPECT_NE(message.find("the first parameter with a non-finite gradient is " + poisoned),
            std::string::npos) << message;
  EXPECT_EQ(trainer.step(), 2);
  test::world().barrier().wait();
  if (test::world().rank() == 0) {
    EXPECT_TRUE(fs::exists(cfg.train.out_dir + "/step_00000002/meta.json"));
    EXPECT_FALSE(fs::exists(cfg.train.out_dir + "/step_00000003"));
    fs::remove_all(dir);
  }
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void expect_fp16_skip(int zero_stage) {
  const std::string dir = shared_folder();
  Config cfg = tiny_config(dir, zero_stage);
  cfg.train.steps = 7;
  cfg.train.dtype = Precision::fp16;
  cfg.train.loss_scale.initial = 1024;
  cfg.train.loss_scale.hysteresis = 1;
  cfg.train.loss_scale.growth_interval = 3;
  Trainer trainer(cfg, "");
  trainer.inject_gradient_fault([&](int64_t step, int unit, ParamStore& params) {
    if (step == 2 && unit == 2 && test::world().rank() == 1)
      params.grad(params.find("blocks.1.mlp.fc.weight"))[5] =
          std::numeric_limits<float>::infinity();
  });
  trainer.run();
  EXPECT_EQ(trainer.step(), 7);
  test::world().barrier().wait();
  if (test::world().rank() != 0) return;
  // Step 3 was skipped: the scale halves; three good steps later (4, 5, 6) it doubles.
  std::vector<double> scales;
  std::vector<int64_t> skipped;
  for (std::ifstream in(cfg.train.out_dir + "/metrics.jsonl"); in;) {
    std::string line;
    if (!std::getline(in, line) || line.empty()) continue;
    const nlohmann::json m = nlohmann::json::parse(line);
    if (!m.contains("loss_scale")) continue;
    scales.push_back(m["loss_scale"].get<double>());
    skipped.push_back(m["skipped_steps"].get<int64_t>());
  }
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 1024, 512, 512, 512, 1024}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1}));
  // Every rank's state after the skipped step is that of the step before, bit for bit.
  int files = 0;
  for (const auto& f : fs::directory_iterator(cfg.train.out_dir + "/step_00000003")) {
    const std::string name = f.path().filename().string();
    if (name == "meta.json") continue;
    ++files;
    EXPECT_EQ(file_bytes(f.path().string()),
              file_bytes(cfg.train.out_dir + "/step_00000002/" + name)) << name;
    EXPECT_NE(file_bytes(f.path().string()),
              file_bytes(cfg.train.out_dir + "/step_00000004/" + name)) << name;
  }
  EXPECT_GT(files, 0);
  fs::remove_all(dir);
}

TEST(TrainNonFinite, DdpStopsEveryRankBeforeTheUpdate) { expect_stop_before_update(0); }

TEST(TrainNonFinite, Zero2StopsEveryRankBeforeTheUpdate) { expect_stop_before_update(2); }

TEST(TrainNonFinite, EpNamesTheExpertOfTheRankHoldingIt) { expect_stop_before_update(0, true); }

TEST(TrainNonFinite, Fp16DdpSkipsTheStepOnEveryRank) { expect_fp16_skip(0); }

TEST(TrainNonFinite, Fp16Zero2SkipsTheStepOnEveryRank) { expect_fp16_skip(2); }

}  // namespace
}  // namespace cleave
