#include "cleave/train/trainer.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/folder.h"
#include "cleave/comm/errors.h"
#include "cleave/train/checkpoint_io.h"
#include "cleave/optim/schedule.h"
#include "cleave/parallel/mesh_groups.h"
#include "cleave/train/layout.h"

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

// Every rank's string at rank 0 (others get nothing): what each writer lists in meta.json.
std::vector<std::string> gather_strings(const std::string& mine, int rank, int world) {
  int length = int(mine.size());
  std::vector<int> lengths(static_cast<size_t>(world)), displs(static_cast<size_t>(world));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int at = 0;
    for (int r = 0; r < world; ++r) displs[size_t(r)] = at, at += lengths[size_t(r)];
    all.resize(size_t(at));
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < world; ++r)
      out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lengths[size_t(r)])));
  return out;
}

}  // namespace

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

namespace {

// The checkpoint folder a run continues from ("" for a fresh run), or an error that names the
// folders involved.
std::string checkpoint_to_resume(const std::string& resume, const std::string& out_dir) {
  if (resume == "latest") {
    const std::string latest = latest_checkpoint(out_dir);
    if (latest.empty())
      throw Error("--resume latest: no checkpoint (step_NNNNNNNN folder) in " + out_dir);
    return latest;
  }
  if (resume.empty())
    if (const std::string existing = latest_checkpoint(out_dir); !existing.empty())
      throw Error("train.out_dir " + out_dir + " already holds checkpoints (newest " + existing +
                  "): pass --resume latest to continue that run, or choose another train.out_dir");
  return resume;
}

}  // namespace

Trainer::Trainer(const Config& cfg, const std::string& resume) : cfg_(cfg) {
  if (cfg_.train.threads > 0) omp_set_num_threads(cfg_.train.threads);
  const TrainConfig& t = cfg_.train;
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  // What can go wrong before the first collective is checked on every rank and agreed on: a bad
  // layout, data file or out_dir then ends the job alike on every rank, reported once.
  std::string from;
  std::unique_ptr<Layout> layout;
  agree_on_errors([&] {
    layout = std::make_unique<Layout>(plan_layout(cfg_, world_));
    mesh_ = std::make_unique<Mesh>(layout->mesh);
    local_batch_ = layout->local_batch;
    const std::string dir = cfg_.data.dir;
    train_shard_ = std::make_unique<TokenShard>(dir + "/train.bin", cfg_.model.vocab_size);
    val_shard_ = std::make_unique<TokenShard>(dir + "/val.bin", cfg_.model.vocab_size);
    train_loader_ = std::make_unique<BatchLoader>(*train_shard_, t.seq_len, t.seed, 0);
    val_loader_ = std::make_unique<BatchLoader>(*val_shard_, t.seq_len, t.seed, 1);
    from = checkpoint_to_resume(resume, t.out_dir);
  });
  world_group_ = make_group(*mesh_, rank_, {Axis::pp, Axis::dp_replicate, Axis::dp_shard,
                                            Axis::cp, Axis::tp}, "world");
  dp_group_ = make_group(*mesh_, rank_, {Axis::dp_replicate, Axis::dp_shard}, "dp");
  shard_group_ = make_group(*mesh_, rank_, {Axis::dp_shard}, "dp_shard");
  replicate_group_ = make_group(*mesh_, rank_, {Axis::dp_replicate}, "dp_replicate");
  tp_group_ = make_group(*mesh_, rank_, {Axis::tp}, "tp");
  pp_group_ = make_group(*mesh_, rank_, {Axis::pp}, "pp");
  dp_size_ = dp_group_->size();
  dp_rank_ = dp_group_->rank();
  long pid = long(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  job_tag_ = std::to_string(pid);

  TensorParallelOptions tp;
  if (tp_group_->size() > 1) {
    make_tp_groups();
    tp = {tp_comm_.get(), cfg_.parallel.sequence_parallel, cfg_.parallel.check_placements};
  }
  model_ = std::make_unique<Transformer>(cfg_.model, t.dtype, t.seed, 16 * shard_group_->size(),
                                         cfg_.parallel.zero_stage < 3, tp,
                                         stage_chunks(*layout, pp_group_->rank()));
  if (tp_comm_)
    tp_grads_ = std::make_unique<TensorParallelGrads>(model_->params(), *tp_comm_, *tp_group_,
                                                      kv_comm_.get());
  // Each parameter group's gradients are reduced and sharded over its axes: "dense" over
  // dp_replicate x dp_shard, sharded over dp_shard (tp's pending sums come first, by placement).
  ParamStore& params = model_->params();
  for (int g = 0; g < params.n_groups(); ++g) {
    CLEAVE_CHECK(params.group_name(g) == "dense",
                 "parameter group " << params.group_name(g) << " maps to no mesh axes");
    GroupParallel part;
    part.dp = std::make_unique<DataParallel>(
        params, DataParallelGroups{dp_group_.get(), shard_group_.get(), replicate_group_.get()},
        cfg_.parallel.zero_stage, cfg_.parallel.bucket_mb, params.unit_bounds(g), t.seed);
    part.optim = std::make_unique<AdamW>(params, cfg_.optim, part.dp->ranges(),
                                         cfg_.parallel.zero_stage == 0);
    groups_.push_back(std::move(part));
  }
  make_pipeline(*layout);

  // Each rank reads its own part of the checkpoint: a bad part may be seen by some ranks only.
  if (!from.empty()) agree_on_errors([&] { load_checkpoint(from); });

  if (rank_ == 0) {
    fs::create_directories(t.out_dir);
    std::ofstream(t.out_dir + "/config.toml") << to_toml(cfg_);
    metrics_.open(t.out_dir + "/metrics.jsonl", from.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics_) throw Error("cannot write " + t.out_dir + "/metrics.jsonl");
  }

  resolve_peaks();
}

void Trainer::make_tp_groups() {
  tp_comm_ = std::make_unique<GroupTpComm>(*tp_group_);
  const TpShare share = tp_share(cfg_.model, tp_group_->size(), tp_group_->rank());
  if (!share.kv_replicated) return;
  // The tp ranks whose query heads use one kv head sum its gradient.
  MPI_Comm kv;
  MPI_Comm_split(tp_group_->comm(), share.first_kv_head, tp_group_->rank(), &kv);
  kv_group_ = std::make_unique<Group>(kv, "tp_kv");
  MPI_Comm_free(&kv);
  kv_comm_ = std::make_unique<GroupTpComm>(*kv_group_);
}

void Trainer::resolve_peaks() {
  // One rank per host resolves the peak (from the cache, or measuring it alone while the others
  // wait) and tells the host's other ranks; MFU's denominators sum every rank's figure.
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host);
  int host_rank = 0;
  MPI_Comm_rank(host, &host_rank);
  double figures[6] = {};
  if (host_rank == 0) {
    PeakRequest request;
    request.precision = cfg_.train.dtype;
    request.threads = omp_get_max_threads();
    request.configured_gflops = cfg_.train.peak_gflops;
    request.hardware = cfg_.train.mfu_peak == MfuPeak::hardware;
    request.cache_path = default_peak_cache();
    peak_ = resolve_peak(request);
    const HardwarePeak& h = peak_.hardware;
    const double mine[6] = {peak_.gflops, double(int(peak_.source)), h.gflops, h.ghz,
                            h.flops_per_cycle, h.derived ? 1.0 : 0.0};
    std::copy(mine, mine + 6, figures);
  }
  MPI_Bcast(figures, 6, MPI_DOUBLE, 0, host);
  MPI_Comm_free(&host);
  if (host_rank != 0) {
    peak_.gflops = figures[0];
    peak_.source = PeakSource(int(figures[1]));
    peak_.hardware = {figures[2], figures[3], figures[4], omp_get_max_threads(), "",
                      figures[5] != 0};
  }
  double sums[2] = {peak_.gflops, peak_.hardware.gflops};
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  peak_sum_ = sums[0];
  hardware_sum_ = sums[1];
}

void Trainer::make_pipeline(const Layout& layout) {
  const StageMap& stages = layout.check.stages;
  const int pp = pp_group_->size(), pp_rank = pp_group_->rank();
  const int n_stages = layout.schedule.n_stages;
  for (const int64_t m : {int64_t(layout.schedule.microbatches), cfg_.train.val_batches})
    if (2 * n_stages * m > 32768)
      throw EveryRankError("the pipeline's " + std::to_string(n_stages) + " stages x " +
                           std::to_string(m) + " micro-batches need more message tags than MPI "
                           "guarantees (32768 / 2): fewer micro-batches or stages");
  const UnitLayout units = unit_layout(*model_);
  const bool zero3 = cfg_.parallel.zero_stage == 3;
  const int n_groups = int(groups_.size());
  train_program_ = lower_schedule(layout.schedule, stages, pp_rank, units, {zero3, true, n_groups});
  val_program_ = lower_schedule(forward_only_schedule(stages, pp, int(cfg_.train.val_batches)),
                                stages, pp_rank, units, {zero3, false, n_groups});
  // GPT-2's tied embedding on the first and the last stage: the pair sums its gradient.
  if (pp > 1 && cfg_.model.tie_embeddings) {
    MPI_Comm tied;
    MPI_Comm_split(pp_group_->comm(), model_->pipeline_tied_tensor() >= 0 ? 0 : MPI_UNDEFINED,
                   pp_rank, &tied);
    if (tied != MPI_COMM_NULL) {
      tied_group_ = std::make_unique<Group>(tied, "pp_tied");
      MPI_Comm_free(&tied);
    }
  }
  StepEndParts end;
  end.params = &model_->params();
  for (GroupParallel& part : groups_) end.groups.push_back({part.dp.get(), part.optim.get()});
  end.dp = dp_group_.get();
  end.shard = shard_group_.get();
  end.pp = pp > 1 ? pp_group_.get() : nullptr;
  end.tp_grads = tp_grads_.get();
  end.zero_stage = cfg_.parallel.zero_stage;
  end.grad_clip = cfg_.optim.grad_clip;
  step_end_ = std::make_unique<StepEnd>(std::move(end));
  StepParts parts;
  parts.model = model_.get();
  parts.end = step_end_.get();
  for (GroupParallel& part : groups_) parts.dp.push_back(part.dp.get());
  parts.tp_grads = tp_grads_.get();
  parts.pp = pp_group_.get();
  parts.tied = tied_group_.get();
  parts.rank = rank_;
  parts.before_reduce = [this](int unit) {
    if (gradient_fault_) gradient_fault_(step_, unit, model_->params());
  };
  executor_ = std::make_unique<StepExecutor>(std::move(parts));
  schedule_name_ = layout.schedule.name;
  n_stages_ = n_stages;
  double count = double(model_->params().global_count());
  if (pp > 1) count = sum_of_doubles(*pp_group_, count);
  global_params_ = std::llround(count);
}

std::string Trainer::pipeline_description() const {
  const int pp = pp_group_->size();
  if (pp == 1) return "";
  return " x pp " + std::to_string(pp) + " (" + schedule_name_ + ", " + std::to_string(n_stages_) +
         " stages)";
}

StepResult Trainer::train_step(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t mb = t.micro_batch_size, T = t.seq_len, accum = t.grad_accum_steps;
  const float grad_scale = 1.0f / float(mb * T * accum);  // the mean over the global batch
  // What validation waited on and sent belongs to no step.
  for (GroupParallel& part : groups_) part.dp->take_exposed_seconds();
  for (GroupTpComm* c : {tp_comm_.get(), kv_comm_.get()})
    if (c) c->take_exposed_seconds(), c->take_bytes();
  for (GroupParallel& part : groups_) part.dp->zero_gradients();
  StepRun run;
  run.B = local_batch_;
  run.T = T;
  run.grad_scale = grad_scale;
  run.trace = t.trace_step == step + 1;
  run.fill = [this, step, mb](int micro, int32_t* tokens, int32_t* targets) {
    train_loader_->fill(tokens, targets, uint64_t(step), micro * mb + dp_rank_ * local_batch_,
                        local_batch_);
  };
  run.step = step;
  run.lr = learning_rate(cfg_.optim, step, t.steps);
  run.loss_tokens = double(mb * T * accum);
  const StepTimes times = executor_->run(train_program_, run);
  StepResult r;
  r.loss = times.end.loss;
  r.lr = run.lr;
  r.grad_norm = times.end.grad_norm;
  r.exposed_dp_s = times.end.exposed_dp;
  r.exposed_tp_s = times.end.exposed_tp;
  r.exposed_pp_s = times.exposed_pp + times.end.exposed_pp;
  for (GroupParallel& part : groups_) r.exposed_dp_s += part.dp->take_exposed_seconds();
  // The kv replicas are tp ranks: their sums count as the tp axis's.
  for (GroupTpComm* c : {tp_comm_.get(), kv_comm_.get()})
    if (c) {
      r.exposed_tp_s += c->take_exposed_seconds();
      r.tp_bytes += c->take_bytes();
    }
  r.pp_bytes = times.pp_bytes;
  r.busy_s = times.busy_seconds;
  r.program_s = times.seconds;
  if (run.trace) write_trace(step + 1, times.trace);
  return r;
}

double Trainer::validate() {
  const TrainConfig& t = cfg_.train;
  const int64_t mb = t.micro_batch_size, T = t.seq_len;
  StepRun run;
  run.B = local_batch_;
  run.T = T;
  run.fill = [this](int b, int32_t* tokens, int32_t* targets) {
    val_loader_->fill(tokens, targets, uint64_t(b), dp_rank_ * local_batch_, local_batch_);
  };
  const StepTimes v = executor_->run(val_program_, run);
  double sum = sum_of_doubles(*dp_group_, v.loss_sum);
  if (pp_group_->size() > 1) sum = sum_of_doubles(*pp_group_, sum);
  return sum / double(t.val_batches * mb * T);
}

void Trainer::write_trace(int64_t step, const std::vector<TraceEvent>& mine) {
  // Every rank's spans at rank 0, one track per world rank.
  nlohmann::json list = nlohmann::json::array();
  for (const TraceEvent& e : mine) list.push_back({e.name, e.start_us, e.duration_us});
  const std::vector<std::string> all = gather_strings(list.dump(), rank_, world_);
  if (rank_ != 0) return;
  std::vector<TraceEvent> events;
  for (int r = 0; r < world_; ++r)
    for (const nlohmann::json& e : nlohmann::json::parse(all[size_t(r)]))
      events.push_back({r, e[0].get<std::string>(), e[1].get<double>(), e[2].get<double>()});
  const std::string path = cfg_.train.out_dir + "/trace_step_" + std::to_string(step) + ".json";
  write_chrome_trace(path, events);
  std::printf("wrote %s\n", path.c_str());
}

void Trainer::run(int64_t exit_after) {
  const TrainConfig& t = cfg_.train;
  // mpirun binds each rank to one core by default when ranks <= 2: its OpenMP threads then share
  // that core, which halves a 2-thread rank's speed without any other sign.
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < omp_get_max_threads())
    std::fprintf(stderr,
                 "cleave: warning: rank %d may run on %d CPU(s) but uses %d threads; under mpirun "
                 "pass --bind-to none or --map-by slot:PE=%d\n",
                 rank_, CPU_COUNT(&cpus), omp_get_max_threads(), omp_get_max_threads());
  if (rank_ == 0) {
    std::cout << "cleave: " << family_name(cfg_.model.family) << " model, "
              << global_params_ << " parameters, "
              << (t.dtype == Precision::bf16 ? "bf16" : "fp32") << ", " << world_ << " rank"
              << (world_ > 1 ? "s" : "") << " (dp_replicate " << replicate_group_->size()
              << " x dp_shard " << shard_group_->size() << " x tp " << tp_group_->size()
              << pipeline_description()
              << (cfg_.parallel.sequence_parallel ? " with sequence parallelism" : "")
              << ", ZeRO-" << cfg_.parallel.zero_stage << ") x " << omp_get_max_threads() << " threads, global batch "
              << int64_t(t.micro_batch_size) * t.grad_accum_steps << " x " << t.seq_len
              << " tokens\n"
              << "MFU against " << std::llround(peak_.gflops) << " GF/s per rank ("
              << source_name(peak_.source) << (peak_.source == PeakSource::measured ||
                                                 peak_.source == PeakSource::cached
                                                   ? " GEMM peak" : "")
              << "); hardware FMA peak per rank " << describe(peak_.hardware) << "\n";
    if (step_ > 0) std::cout << "resumed at step " << step_ << "\n";
    for (const std::string& change : resume_changes_)
      std::cout << "resume: " << change << ": the batches from step " << step_ + 1
                << " on are not those the checkpointed run would have drawn\n";
  }
  // Throughput counts the training steps' own time: validation and checkpoints are left out.
  double interval_seconds = 0;
  StepResult interval;  // sums over the interval's steps
  int64_t interval_steps = 0;
  const int64_t first_step = step_;
  while (step_ < t.steps) {
    const double t0 = now_seconds();
    const StepResult r = train_step(step_);
    const double step_seconds = now_seconds() - t0;
    elapsed_ += step_seconds;
    interval_seconds += step_seconds;
    ++steps_timed_;
    ++step_;
    ++interval_steps;
    interval.exposed_dp_s += r.exposed_dp_s;
    interval.exposed_tp_s += r.exposed_tp_s;
    interval.exposed_pp_s += r.exposed_pp_s;
    interval.busy_s += r.busy_s;
    interval.program_s += r.program_s;
    interval.tp_bytes += r.tp_bytes;
    interval.pp_bytes += r.pp_bytes;
    if (step_ % t.log_interval == 0 || step_ == t.steps) {
      log_step(r, interval_seconds, interval_steps, interval);
      interval_seconds = 0;
      interval_steps = 0;
      interval = StepResult();
    }
    if (t.val_interval > 0 && (step_ % t.val_interval == 0 || step_ == t.steps)) {
      const double v = validate();
      if (rank_ == 0) {
        std::printf("step %lld | val loss %.4f\n", (long long)step_, v);
        metrics_ << nlohmann::json{{"step", step_}, {"val_loss", v}}.dump() << "\n" << std::flush;
      }
    }
    const bool exiting = exit_after > 0 && step_ - first_step == exit_after;
    const bool due = t.checkpoint_interval > 0 ? step_ % t.checkpoint_interval == 0 || step_ == t.steps
                                               : t.checkpoint_interval == 0 && step_ == t.steps;
    if (due || exiting) save_checkpoint();
    if (exiting) {
      if (rank_ == 0) std::printf("exiting after %lld steps (--exit-after)\n", (long long)exit_after);
      break;
    }
  }
  std::fflush(stdout);
}

void Trainer::log_step(const StepResult& r, double seconds, int64_t steps,
                       const StepResult& interval) {
  // Every rank's peak resident memory, so a layout whose ranks differ shows each.
  // and the fraction of its step program each rank spent outside compute (the pipeline bubble
  // and exposed communication).
  float mine[2] = {float(peak_rss_mib()), float(1.0 - interval.busy_s / interval.program_s)};
  std::vector<float> all(2 * static_cast<size_t>(world_));
  world_group_->all_gather(mine, all.data(), 2, CommType::f32, CommAlgo::ours).wait();
  if (rank_ != 0) return;
  std::vector<float> rss_of, idle_of;
  for (int r = 0; r < world_; ++r) {
    rss_of.push_back(all[2 * size_t(r)]);
    idle_of.push_back(all[2 * size_t(r) + 1]);
  }
  const TrainConfig& t = cfg_.train;
  const double tokens = double(steps) * t.micro_batch_size * t.grad_accum_steps * t.seq_len;
  const double tok_s = tokens / seconds;
  // docs/architecture.md, MFU: 6 x matmul parameters + 6 x layers x sequence x d_model (causal,
  // halved).
  const double flops_per_token = 6.0 * double(model_->matmul_params()) +
                                 6.0 * cfg_.model.n_layers * t.seq_len * cfg_.model.d_model;
  const double model_gflops = tok_s * flops_per_token * 1e-9;
  const double mfu = model_gflops / peak_sum_;
  const double mfu_hardware = hardware_sum_ > 0 ? model_gflops / hardware_sum_ : 0.0;
  if (mfu > 1 && !warned_peak_ && peak_.source != PeakSource::configured) {
    warned_peak_ = true;
    std::fprintf(stderr,
                 "cleave: warning: the step ran at %.0f GF/s, above the %s peak of %.0f GF/s: "
                 "that peak is wrong; run `cleave peak --refresh --dtype %s --threads %d`\n",
                 model_gflops, source_name(peak_.source), peak_sum_,
                 t.dtype == Precision::bf16 ? "bf16" : "fp32", peak_.hardware.threads);
  }
  const double dp_ms = 1e3 * interval.exposed_dp_s / double(steps);
  const double tp_ms = 1e3 * interval.exposed_tp_s / double(steps);
  const double pp_ms = 1e3 * interval.exposed_pp_s / double(steps);
  const double comm_ms = dp_ms + tp_ms + pp_ms;
  char comm[128];
  const bool pp = pp_group_->size() > 1;
  double idle = 0;
  for (float f : idle_of) idle += f;
  idle /= double(world_);
  if (pp)
    std::snprintf(comm, sizeof comm, "comm %.0f ms/step (dp %.0f, tp %.0f, pp %.0f) | idle %.1f%%",
                  comm_ms, dp_ms, tp_ms, pp_ms, 100 * idle);
  else if (tp_comm_)
    std::snprintf(comm, sizeof comm, "comm %.0f ms/step (dp %.0f, tp %.0f)", comm_ms, dp_ms, tp_ms);
  else
    std::snprintf(comm, sizeof comm, "comm %.0f ms/step", comm_ms);
  const double eta = double(t.steps - step_) * elapsed_ / double(steps_timed_);
  const double rss_max = *std::max_element(rss_of.begin(), rss_of.end());
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% of %.0f GF/s %s (hw %.0f) | %s | RSS %.0f MiB%s | ETA %s\n",
              (long long)step_, (long long)t.steps, r.loss, r.lr, r.grad_norm, tok_s, 100 * mfu,
              peak_.gflops, source_name(peak_.source), peak_.hardware.gflops, comm, rss_max,
              world_ > 1 ? " (max rank)" : "", format_duration(eta).c_str());
  std::fflush(stdout);
  metrics_ << nlohmann::json{{"step", step_},
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
                             {"exposed_comm_ms", comm_ms},
                             {"exposed_comm_ms_dp", dp_ms},
                             {"exposed_comm_ms_tp", tp_ms},
                             {"exposed_comm_ms_pp", pp_ms},
                             {"idle_fraction_per_rank", idle_of},
                             {"tp_bytes_per_step", double(interval.tp_bytes) / double(steps)},
                             {"pp_bytes_per_step", double(interval.pp_bytes) / double(steps)},
                             {"eta_s", eta}}
                  .dump()
           << "\n"
           << std::flush;
}

void Trainer::save_checkpoint() {
  const TrainConfig& t = cfg_.train;
  ParamStore& params = model_->params();
  // Every writer puts its shard of the state into one temporary folder; rank 0 then checks the
  // files, records them in meta.json and swaps the folder into place. Nothing is gathered but
  // what each writer's file holds. Each pipeline rank and tp rank writes its own files (its
  // data-parallel shards).
  const std::string dir = t.out_dir + "/" + checkpoint_name(step_);
  if (rank_ == 0) begin_checkpoint_folder(dir, job_tag_);
  world_group_->barrier().wait();
  // Files: per pipeline stage and tp rank, each group's data-parallel files one after the other.
  int files_per_tp = 0;
  for (GroupParallel& part : groups_) files_per_tp += part.dp->checkpoint_files();
  std::map<int, std::string> checksums;  // of the files this rank wrote
  nlohmann::json entries = nlohmann::json::array();
  int group_first = 0;
  for (GroupParallel& part : groups_) {
    const int own = part.dp->checkpoint_file();
    if (own >= 0) {
      const int file = (pp_group_->rank() * tp_group_->size() + tp_group_->rank()) * files_per_tp +
                       group_first + own;
      const StateSlices state{part.dp->ranges(), part.dp->values(),
                              {part.optim->m().data(), true}, {part.optim->v().data(), true},
                              tp_grads_ ? tp_grads_->copy() : TpCopy{}};
      checksums[file] = write_state_file(checkpoint_temp_folder(dir, job_tag_), file, params, state);
      entries.push_back({{"file", file}, {"tensors", state_file_entries(file, params, state)}});
    }
    group_first += part.dp->checkpoint_files();
  }
  const std::vector<std::string> listed = gather_strings(entries.dump(), rank_, world_);
  if (rank_ == 0) {
    std::vector<nlohmann::json> entries_of_file(
        size_t(files_per_tp * tp_group_->size() * pp_group_->size()));
    for (const std::string& e : listed)
      for (const nlohmann::json& j : nlohmann::json::parse(e))
        entries_of_file[j["file"].get<size_t>()] = j["tensors"];
    finish_training_checkpoint(dir, job_tag_, cfg_, step_, entries_of_file, checksums,
                               groups_.front().optim->steps_taken(), world_);
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
  world_group_->barrier().wait();  // nobody looks for the checkpoint before it is complete
}

void Trainer::load_checkpoint(const std::string& dir) {
  // Each rank reads only what it keeps, from whichever files hold it: any layout resumes any other.
  const LoadedCheckpoint ck = read_checkpoint_folder(dir);
  step_ = checkpoint_step(ck, dir, cfg_);
  resume_changes_ = resume_changes(ck, dir, cfg_);
  ParamStore& params = model_->params();
  for (int g = 0; g < params.n_groups(); ++g) {
    GroupParallel& part = groups_[size_t(g)];
    // Below ZeRO-3 every rank holds the group's whole values; its optimizer state is its ranges.
    const std::vector<FlatRange> region = {{params.unit_bounds(g).front(), params.unit_bounds(g).back()}};
    const RangeBuffer values = part.dp->values();
    read_state(ck, dir, params, "param", values.packed ? part.dp->ranges() : region, values);
    read_state(ck, dir, params, "adam_m", part.dp->ranges(), {part.optim->m().data(), true});
    read_state(ck, dir, params, "adam_v", part.dp->ranges(), {part.optim->v().data(), true});
    part.optim->set_steps_taken(checkpoint_optimizer_steps(ck, dir));
  }
  params.wrote_all();
}

}  // namespace cleave
