// The trainer's metrics: the progress line and metrics.jsonl of each logged step (rank 0), from
// every rank's peak memory and idle share.
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/train/trainer.h"

namespace cleave {

namespace {

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

void Trainer::log_step(const StepResult& r, double seconds, int64_t steps,
                       const StepResult& interval) {
  // Every rank's peak resident memory, so a layout whose ranks differ shows each.
  // and the fraction of its step program each rank spent outside compute (the pipeline bubble
  // and exposed communication).
  // And what its activations were predicted to take (parallel/activation_memory.h), beside it.
  float mine[3] = {float(peak_rss_mib()), float(1.0 - interval.busy_s / interval.program_s),
                   float(double(activations_.total()) / (1 << 20))};
  std::vector<float> all(3 * static_cast<size_t>(world_));
  process_.world->all_gather(mine, all.data(), 3, CommType::f32, CommAlgo::ours).wait();
  // Each stage's MoE layers (the same on every rank of a stage), at rank 0.
  std::vector<std::string> moe_of_rank;
  if (cfg_.model.moe_experts > 0) {
    nlohmann::json layers = nlohmann::json::array();
    // The rows each expert kept and the choices dropped: means per step over the interval.
    for (const MoeLayerStats& s : step_end_->moe_layer_stats()) {
      std::vector<double> kept = interval.expert_rows.at(s.layer);
      for (double& v : kept) v /= double(steps);
      layers.push_back({{"layer", s.layer}, {"tokens", s.tokens}, {"dropped", s.dropped},
                        {"aux", s.aux}, {"z", s.z}, {"bias", s.bias}, {"kept", kept},
                        {"dropped_mean", interval.dropped_rows.at(s.layer) / double(steps)}});
    }
    moe_of_rank = gather_strings(layers.dump(), rank_, world_);
  }
  if (rank_ != 0) return;
  std::vector<float> rss_of, idle_of, activations_of;
  for (int r = 0; r < world_; ++r) {
    rss_of.push_back(all[3 * size_t(r)]);
    idle_of.push_back(all[3 * size_t(r) + 1]);
    activations_of.push_back(all[3 * size_t(r) + 2]);
  }
  const TrainConfig& t = cfg_.train;
  const double tokens = double(steps) * t.micro_batch_size * t.grad_accum_steps * t.seq_len;
  const double tok_s = tokens / seconds;
  const double flops_per_token = model_flops_per_token(cfg_.model, t.seq_len);
  const double model_gflops = tok_s * flops_per_token * 1e-9;
  const double mfu = model_gflops / peak_sum_;
  const double mfu_hardware = hardware_sum_ > 0 ? model_gflops / hardware_sum_ : 0.0;
  if (mfu > 1 && !warned_peak_ && peak_.source != PeakSource::configured) {
    warned_peak_ = true;
    std::fprintf(stderr,
                 "cleave: warning: the step ran at %.0f GF/s, above the %s peak of %.0f GF/s: "
                 "that peak is wrong; run `cleave peak --refresh --dtype %s --threads %d`\n",
                 model_gflops, source_name(peak_.source), peak_sum_,
                 precision_name(product_precision(t.dtype)), peak_.hardware.threads);
  }
  // Each axis the layout has: its exposed communication on the progress line, and its figures
  // in metrics.jsonl (the bytes beside what the run predicted at its start).
  const bool pp = process_.pp->size() > 1;
  auto present = [&](CommAxis a) {
    for (const auto& [axis, meter] : meters_)
      if (axis == a) return true;
    return a == CommAxis::pp && pp;
  };
  double comm_ms = 0;
  std::string axes;
  char part[48];
  nlohmann::json comm_record = nlohmann::json::object();
  for (CommAxis a : kCommAxes) {
    const std::string name = comm_axis_name(a);
    const double ms = 1e3 * interval.comm[a].exposed_s / double(steps);
    comm_ms += ms;
    comm_record["exposed_comm_ms_" + name] = ms;
    comm_record[name + "_bytes_per_step"] = double(interval.comm[a].bytes) / double(steps);
    comm_record[name + "_bytes_per_step_predicted"] = predicted_[a].bytes;
    if (a == CommAxis::dp || !present(a)) continue;
    std::snprintf(part, sizeof part, ", %s %.0f", name.c_str(), ms);
    axes += part;
  }
  const double dp_ms = 1e3 * interval.comm[CommAxis::dp].exposed_s / double(steps);
  double idle = 0;
  for (float f : idle_of) idle += f;
  idle /= double(world_);
  char comm[160];
  if (axes.empty())
    std::snprintf(comm, sizeof comm, "comm %.0f ms/step", comm_ms);
  else
    std::snprintf(comm, sizeof comm, "comm %.0f ms/step (dp %.0f%s)", comm_ms, dp_ms, axes.c_str());
  if (pp) {
    std::snprintf(part, sizeof part, " | idle %.1f%%", 100 * idle);
    std::strncat(comm, part, sizeof comm - std::strlen(comm) - 1);
  }
  // Mixture of experts: the balancing terms beside the loss, and the worst layer's load.
  char moe_text[96] = "";
  nlohmann::json moe_record = nlohmann::json::object();
  if (!moe_of_rank.empty()) {
    std::map<int, nlohmann::json> by_layer;
    for (const std::string& ranks : moe_of_rank)
      for (const nlohmann::json& l : nlohmann::json::parse(ranks)) by_layer[l["layer"].get<int>()] = l;
    // The balancing terms as they enter the loss: the auxiliary loss's mean over the step's
    // sequences, the z-loss's over its tokens; the load as max / mean tokens per expert.
    const double sequences = double(t.micro_batch_size) * t.grad_accum_steps;
    const double step_tokens = sequences * t.seq_len;
    double aux = 0, z = 0, worst = 0;
    int worst_layer = -1;
    nlohmann::json layers = nlohmann::json::array();
    for (auto& [layer, l] : by_layer) {
      const std::vector<double> tokens = l["tokens"].get<std::vector<double>>();
      const double lo = *std::min_element(tokens.begin(), tokens.end());
      const double hi = *std::max_element(tokens.begin(), tokens.end());
      double mean = 0;
      for (double v : tokens) mean += v;
      mean /= double(tokens.size());
      const double load = mean > 0 ? hi / mean : 0;
      if (worst_layer < 0 || load > worst) worst = load, worst_layer = layer;
      aux += l["aux"].get<double>() / sequences;
      z += l["z"].get<double>() / step_tokens;
      nlohmann::json entry{{"layer", layer},
                           {"tokens_min", lo},
                           {"tokens_mean", mean},
                           {"tokens_max", hi},
                           {"load_max_over_mean", load},
                           {"dropped", l["dropped"]},
                           {"rows_per_expert", l["kept"]},
                           {"dropped_per_step", l["dropped_mean"]},
                           {"aux_loss", l["aux"].get<double>() / sequences},
                           {"z_loss", l["z"].get<double>() / step_tokens}};
      const std::vector<float> bias = l["bias"].get<std::vector<float>>();
      if (!bias.empty()) {
        entry["bias_min"] = *std::min_element(bias.begin(), bias.end());
        entry["bias_max"] = *std::max_element(bias.begin(), bias.end());
      }
      layers.push_back(entry);
    }
    moe_record = {{"moe_aux_loss", aux}, {"moe_z_loss", z}, {"moe_layers", layers}};
    std::snprintf(moe_text, sizeof moe_text, " | moe aux %.4f z %.4f load %.2f (layer %d)", aux,
                  z, worst, worst_layer);
  }
  const double eta = double(t.steps - step_) * elapsed_ / double(steps_timed_);
  const double rss_max = *std::max_element(rss_of.begin(), rss_of.end());
  // fp16: the scale the last step ran at, and the steps skipped for overflows so far (the updates
  // AdamW did not take).
  const int64_t skipped = scaler_ ? step_ - groups_.front().optim->steps_taken() : 0;
  char scale[64] = "";
  if (scaler_) std::snprintf(scale, sizeof scale, " | scale %g (%lld skipped)", r.loss_scale,
                             (long long)skipped);
  std::printf("step %6lld/%lld | loss %.4f%s | lr %.2e | grad norm %.3f%s | %.0f tok/s | MFU %.1f%% of %.0f GF/s %s (hw %.0f) | %s | RSS %.0f MiB%s | ETA %s\n",
              (long long)step_, (long long)t.steps, r.loss, moe_text, r.lr, r.grad_norm, scale, tok_s,
              100 * mfu, peak_.gflops, source_name(peak_.source), peak_.hardware.gflops, comm,
              rss_max, world_ > 1 ? " (max rank)" : "", format_duration(eta).c_str());
  std::fflush(stdout);
  nlohmann::json record{{"step", step_},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tok_s},
                        {"mfu", mfu},
                        {"peak_gflops", peak_.gflops},
                        {"peak_source", source_name(peak_.source)},
                        {"mfu_hardware", mfu_hardware},
                        {"hardware_peak_gflops", peak_.hardware.gflops},
                        {"peak_rss_mib", rss_max},
                        {"peak_rss_mib_per_rank", rss_of},
                        {"activation_mib_predicted_per_rank", activations_of},
                        {"exposed_comm_ms", comm_ms},
                        {"idle_fraction_per_rank", idle_of},
                        {"zero3_gather_bytes_per_step", double(interval.gather_bytes) / double(steps)},
                        {"eta_s", eta}};
  record.update(comm_record);
  if (scaler_) {
    record["loss_scale"] = r.loss_scale;
    record["skipped_steps"] = skipped;
  }
  record.update(moe_record);
  metrics_ << record.dump() << "\n" << std::flush;
}

}  // namespace cleave
