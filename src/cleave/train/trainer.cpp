#include "cleave/train/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/folder.h"
#include "cleave/train/checkpoint_io.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/optim/grad_norm.h"
#include "cleave/optim/schedule.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format_duration(double s) {
  char buf[64];
  const long t = long(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t / 60 % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  return buf;
}

}  // namespace

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

Trainer::Trainer(const Config& cfg, const std::string& resume) : cfg_(cfg) {
  if (cfg_.train.threads > 0) omp_set_num_threads(cfg_.train.threads);
  const TrainConfig& t = cfg_.train;
  const std::string dir = cfg_.data.dir;
  train_shard_ = std::make_unique<TokenShard>(dir + "/train.bin", cfg_.model.vocab_size);
  val_shard_ = std::make_unique<TokenShard>(dir + "/val.bin", cfg_.model.vocab_size);
  train_loader_ = std::make_unique<BatchLoader>(*train_shard_, t.seq_len, t.seed, 0);
  val_loader_ = std::make_unique<BatchLoader>(*val_shard_, t.seq_len, t.seed, 1);
  model_ = std::make_unique<Transformer>(cfg_.model, t.dtype, t.seed);
  optim_ = std::make_unique<AdamW>(model_->params(), cfg_.optim);
  inputs_.resize(int64_t(t.micro_batch_size) * t.seq_len);
  targets_.resize(inputs_.size());

  std::string from = resume;
  if (resume == "latest") {
    from = latest_checkpoint(t.out_dir);
    if (from.empty())
      throw Error("--resume latest: no checkpoint (step_NNNNNNNN folder) in " + t.out_dir);
  }
  if (!from.empty()) load_checkpoint(from);
  else if (const std::string existing = latest_checkpoint(t.out_dir); !existing.empty())
    throw Error("train.out_dir " + t.out_dir + " already holds checkpoints (newest " + existing +
                "): pass --resume latest to continue that run, or choose another train.out_dir");

  fs::create_directories(t.out_dir);
  std::ofstream(t.out_dir + "/config.toml") << to_toml(cfg_);
  metrics_.open(t.out_dir + "/metrics.jsonl", from.empty() ? std::ios::trunc : std::ios::app);
  if (!metrics_) throw Error("cannot write " + t.out_dir + "/metrics.jsonl");

  peak_gflops_ = t.peak_gflops;
  if (peak_gflops_ == 0)
    peak_gflops_ = overall_gflops(bench_linear_shapes(gpt2_small_linear_shapes(), t.dtype, 0.15));
}

StepResult Trainer::train_step(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t mb = t.micro_batch_size, T = t.seq_len, accum = t.grad_accum_steps;
  const float grad_scale = 1.0f / float(mb * T * accum);
  ParamStore& params = model_->params();
  params.grads().zero();
  double loss_sum = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    train_loader_->fill(inputs_.data(), targets_.data(), uint64_t(step), micro * mb, mb);
    model_->forward(inputs_.data(), targets_.data(), mb, T, grad_scale);
    for (int64_t i = 0; i < mb * T; ++i) loss_sum += model_->losses()[i];
    model_->backward();
  }
  StepResult r;
  r.loss = loss_sum / double(mb * T * accum);
  r.grad_norm = std::sqrt(sum_of_squares(params.grads().data(), params.total()));
  float clip = 1.0f;
  if (cfg_.optim.grad_clip > 0 && r.grad_norm > cfg_.optim.grad_clip)
    clip = float(cfg_.optim.grad_clip / r.grad_norm);
  r.lr = learning_rate(cfg_.optim, step, t.steps);
  optim_->step(params, r.lr, clip);
  model_->weights_changed();
  return r;
}

double Trainer::validate() {
  const TrainConfig& t = cfg_.train;
  const int64_t mb = t.micro_batch_size, T = t.seq_len;
  double sum = 0;
  for (int64_t b = 0; b < t.val_batches; ++b) {
    val_loader_->fill(inputs_.data(), targets_.data(), uint64_t(b), 0, mb);
    model_->forward(inputs_.data(), targets_.data(), mb, T, 0.0f);
    for (int64_t i = 0; i < mb * T; ++i) sum += model_->losses()[i];
  }
  return sum / double(t.val_batches * mb * T);
}

void Trainer::run(int64_t exit_after) {
  const TrainConfig& t = cfg_.train;
  std::cout << "cleave: " << family_name(cfg_.model.family) << " model, "
            << model_->params().count() << " parameters, " << (t.dtype == Precision::bf16 ? "bf16" : "fp32")
            << ", " << omp_get_max_threads() << " threads, global batch "
            << int64_t(t.micro_batch_size) * t.grad_accum_steps << " x " << t.seq_len
            << " tokens; MFU against a measured GEMM peak of " << std::llround(peak_gflops_)
            << " GF/s\n";
  if (step_ > 0) std::cout << "resumed at step " << step_ << "\n";
  double interval_start = now_seconds();
  int64_t interval_steps = 0;
  const int64_t first_step = step_;
  while (step_ < t.steps) {
    const double t0 = now_seconds();
    const StepResult r = train_step(step_);
    elapsed_ += now_seconds() - t0;
    ++steps_timed_;
    ++step_;
    ++interval_steps;
    if (!std::isfinite(r.loss))
      throw Error("loss became " + std::to_string(r.loss) + " at step " + std::to_string(step_));
    if (step_ % t.log_interval == 0 || step_ == t.steps) {
      log_step(r, now_seconds() - interval_start, interval_steps);
      interval_start = now_seconds();
      interval_steps = 0;
    }
    if (t.val_interval > 0 && (step_ % t.val_interval == 0 || step_ == t.steps)) {
      const double v = validate();
      std::printf("step %lld | val loss %.4f\n", (long long)step_, v);
      metrics_ << nlohmann::json{{"step", step_}, {"val_loss", v}}.dump() << "\n" << std::flush;
      interval_start = now_seconds();
    }
    const bool exiting = exit_after > 0 && step_ - first_step == exit_after;
    if ((t.checkpoint_interval > 0 && step_ % t.checkpoint_interval == 0) || step_ == t.steps ||
        exiting)
      save_checkpoint();
    if (exiting) {
      std::printf("exiting after %lld steps (--exit-after)\n", (long long)exit_after);
      break;
    }
  }
  std::fflush(stdout);
}

void Trainer::log_step(const StepResult& r, double seconds, int64_t steps) {
  const TrainConfig& t = cfg_.train;
  const double tokens = double(steps) * t.micro_batch_size * t.grad_accum_steps * t.seq_len;
  const double tok_s = tokens / seconds;
  // DESIGN.md section 10: 6 x matmul parameters + 6 x layers x sequence x d_model (causal, halved).
  const double flops_per_token = 6.0 * double(model_->matmul_params()) +
                                 6.0 * cfg_.model.n_layers * t.seq_len * cfg_.model.d_model;
  const double mfu = tok_s * flops_per_token / (peak_gflops_ * 1e9);
  const double eta = double(t.steps - step_) * elapsed_ / double(steps_timed_);
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% of %.0f GF/s | RSS %.0f MiB | ETA %s\n",
              (long long)step_, (long long)t.steps, r.loss, r.lr, r.grad_norm, tok_s, 100 * mfu,
              peak_gflops_, peak_rss_mib(), format_duration(eta).c_str());
  std::fflush(stdout);
  metrics_ << nlohmann::json{{"step", step_},        {"loss", r.loss},
                             {"lr", r.lr},           {"grad_norm", r.grad_norm},
                             {"tokens_per_s", tok_s}, {"mfu", mfu},
                             {"peak_gflops", peak_gflops_}, {"peak_rss_mib", peak_rss_mib()},
                             {"eta_s", eta}}
                  .dump()
           << "\n"
           << std::flush;
}

void Trainer::save_checkpoint() {
  const TrainConfig& t = cfg_.train;
  const std::string dir = t.out_dir + "/" + checkpoint_name(step_);
  save_training_checkpoint(dir, cfg_, step_, model_->params(), *optim_);
  std::printf("saved checkpoint %s\n", dir.c_str());
  // Keep the newest keep_checkpoints folders.
  std::vector<int64_t> steps;
  for (auto& e : fs::directory_iterator(t.out_dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() == 13 && n.rfind("step_", 0) == 0 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      steps.push_back(std::stoll(n.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + t.keep_checkpoints < steps.size(); ++i)
    fs::remove_all(t.out_dir + "/" + checkpoint_name(steps[i]));
}

void Trainer::load_checkpoint(const std::string& dir) {
  const LoadedCheckpoint ck = read_checkpoint_folder(dir);
  step_ = restore_training_state(ck, dir, cfg_, model_->params(), optim_.get());
  model_->weights_changed();
}

}  // namespace cleave
