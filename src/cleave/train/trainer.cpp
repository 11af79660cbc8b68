#include "cleave/train/trainer.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/folder.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/launcher.h"
#include "cleave/optim/schedule.h"
#include "cleave/plan/axis_volume.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The checkpoint folders a run may continue from, in the order to try them (none for a fresh
// run), or an error that names the folders involved.
// "latest" is the newest checkpoint that opens (each file there at its recorded size, each header
// intact): one cut off is skipped and named, and with none at all the run starts from scratch and
// says so, so that one command line serves a job's first start and every requeue. Older ones
// follow it, for a newest one whose bytes turn out corrupted as the ranks read them. notes: what
// rank 0 prints about it; opened: the first one, which loading takes instead of opening it again.
std::vector<std::string> checkpoints_to_resume(const std::string& resume,
                                               const std::string& out_dir,
                                               std::vector<std::string>& notes,
                                               std::optional<LoadedCheckpoint>& opened) {
  if (resume == "latest") {
    std::vector<std::string> out;
    for (const std::string& dir : checkpoints_newest_first(out_dir)) {
      if (!out.empty()) {
        out.push_back(dir);
        continue;
      }
      try {
        opened = read_checkpoint_folder(dir);
        out.push_back(dir);
      } catch (const Error& e) {
        notes.push_back("--resume latest: skipping " + dir + ": " + e.what());
      }
    }
    if (out.empty())
      notes.push_back("--resume latest: no checkpoint that verifies in " + out_dir +
                      ": starting from step 0");
    return out;
  }
  if (resume.empty()) {
    if (const std::string existing = latest_checkpoint(out_dir); !existing.empty())
      throw Error("train.out_dir " + out_dir + " already holds checkpoints (newest " + existing +
                  "): pass --resume latest to continue that run, or choose another train.out_dir");
    return {};
  }
  return {resume};
}

}  // namespace

Trainer::Trainer(const Config& cfg, const std::string& resume) : cfg_(cfg) {
  // From here on: a SIGTERM while the model is built or loaded is answered at the first step's end.
  if (cfg_.train.checkpoint_on_signal)
    sigterm_is_a_request("a checkpoint is saved at the next step's end, then the run exits");
  if (cfg_.train.threads > 0) omp_set_num_threads(cfg_.train.threads);
  const TrainConfig& t = cfg_.train;
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  // What can go wrong before the first collective is checked on every rank and agreed on: a bad
  // layout, data file or out_dir then ends the job alike on every rank, reported once.
  std::vector<std::string> candidates;
  std::vector<std::string> resume_notes;
  std::optional<LoadedCheckpoint> opened;
  std::unique_ptr<Layout> layout;
  agree_on_errors([&] {
    layout = std::make_unique<Layout>(plan_layout(cfg_.model, cfg_.parallel, cfg_.train, world_));
    mesh_ = std::make_unique<Mesh>(layout->mesh);
    local_batch_ = layout->local_batch;
    const std::string dir = cfg_.data.dir;
    train_shard_ = std::make_unique<TokenShard>(dir + "/train.bin", cfg_.model.vocab_size);
    val_shard_ = std::make_unique<TokenShard>(dir + "/val.bin", cfg_.model.vocab_size);
    const DocumentOptions documents{cfg_.data.document_mask, cfg_.data.reset_positions,
                                    int32_t(cfg_.data.document_separator)};
    // Each cp rank takes its two chunks of every window (the cp coordinate is the mesh's).
    const ContextSplit split{mesh_->degree(Axis::cp), mesh_->coords(rank_)[size_t(Axis::cp)]};
    train_loader_ =
        std::make_unique<BatchLoader>(*train_shard_, t.seq_len, t.seed, 0, documents, split);
    val_loader_ = std::make_unique<BatchLoader>(*val_shard_, t.seq_len, t.seed, 1, documents, split);
    candidates = checkpoints_to_resume(resume, t.out_dir, resume_notes, opened);
    // A resumed run continues from its own checkpoint, which has long left train.init_from's.
    if (candidates.empty() && !t.init_from.empty()) init_dir_ = init_checkpoint(t.init_from);
    else if (!t.init_from.empty())
      resume_notes.push_back("train.init_from = " + t.init_from + " is not read: the run " +
                             "continues from " + candidates.front());
  });
  if (rank_ == 0)
    for (const std::string& note : resume_notes) std::printf("cleave: %s\n", note.c_str());
  process_ = make_process_groups(*mesh_, rank_, cfg_.model, layout->check.stages,
                                 layout->cp_mode);
  cp_ = mesh_->degree(Axis::cp);
  dp_size_ = process_.dp->size();
  dp_rank_ = process_.dp->rank();
  long pid = long(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  job_tag_ = std::to_string(pid);

  TensorParallelOptions tp;
  if (process_.tp_comm)
    tp = {process_.tp_comm.get(), cfg_.parallel.sequence_parallel, cfg_.parallel.check_placements};
  // Units are padded to equal ZeRO shards over dp_shard x cp (the dense group's shard axes).
  model_ = std::make_unique<Transformer>(cfg_.model, t.dtype, t.seed,
                                         16 * process_.shard->size() * cp_,
                                         cfg_.parallel.zero_stage < 3 ? ParamValues::seeded
                                                                      : ParamValues::unset,
                                         tp,
                                         stage_chunks(*layout, process_.pp->rank()),
                                         process_.context, process_.ep_comm.get());
  model_->set_loss_chunk(t.loss_chunk);
  if (process_.tp_comm)
    tp_grads_ = std::make_unique<TensorParallelGrads>(model_->params(), *process_.tp_comm,
                                                      *process_.tp, process_.kv_comm.get());
  // Each parameter group's gradients are reduced and sharded over the axes the table gives it
  // (tp's pending sums come first, by placement).
  ParamStore& params = model_->params();
  axes_ = axis_table(params, *mesh_);
  if (cfg_.optim.offload == "file" || cfg_.parallel.offload_params == "file") {
    std::error_code ignored;  // another rank may make it first; AdamW's error names the folder
    fs::create_directories(cfg_.optim.offload_dir, ignored);
  }
  for (int g = 0; g < params.n_groups(); ++g) {
    const GroupAxes& a = axes_.groups[size_t(g)];
    GroupParallel part;
    part.shard = process_.along(a.shard);
    if (!a.spread.empty()) part.spread = process_.along(a.spread);
    part.dp = std::make_unique<DataParallel>(
        params, DataParallelGroups{process_.along(a.reduce), part.shard,
                                   process_.along(a.replicate())},
        cfg_.parallel.zero_stage, cfg_.parallel.bucket_mb, params.unit_bounds(g), t.seed,
        cfg_.parallel.offload_params == "file" ? cfg_.optim.offload_dir : "");
    part.optim = std::make_unique<AdamW>(params, cfg_.optim, part.dp->ranges(),
                                         cfg_.parallel.zero_stage == 0);
    part.optim->stream_values(part.dp->offloaded_values());
    groups_.push_back(std::move(part));
  }
  if (t.dtype == Precision::fp16) scaler_ = std::make_unique<DynamicLossScaler>(t.loss_scale);
  if (t.dtype == Precision::fp8) {
    model_->set_fp8(t.fp8.recipe, t.fp8.margin);
    if (t.fp8.per_tensor())
      fp8_ = std::make_unique<Fp8Scaling>(*process_.world, model_->fp8_gemms(), t.fp8);
    if (cfg_.parallel.fp8_allgather)
      for (GroupParallel& part : groups_)
        part.dp->gather_fp8(t.fp8.recipe == kernels::Fp8Recipe::current, t.fp8.margin);
  }
  for (GroupParallel& part : groups_) meters_.push_back({CommAxis::dp, part.dp.get()});
  for (CommMeter* m : {process_.tp_comm.get(), process_.kv_comm.get()})
    if (m) meters_.push_back({CommAxis::tp, m});
  for (CommMeter* m : {process_.cp_ring.get(), process_.cp_ulysses.get()})
    if (m) meters_.push_back({CommAxis::cp, m});
  if (process_.ep_comm) meters_.push_back({CommAxis::ep, process_.ep_comm.get()});
  make_pipeline(*layout);
  if (rank_ == 0) predicted_ = predicted_traffic(axis_volumes(step_work(cfg_.model, cfg_.parallel, cfg_.train, *layout, 0)));

  // Each rank reads its own part of the checkpoint: a bad part may be seen by some ranks only.
  // Under --resume latest a checkpoint one of them finds corrupted is skipped for the next older
  // one (which then overwrites everything the failed load wrote).
  std::string from;
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      agree_on_errors([&] { load_checkpoint(candidates[i], std::move(opened)); });
      from = candidates[i];
      break;
    } catch (const EveryRankError& e) {
      if (i + 1 == candidates.size()) throw;
      if (rank_ == 0)
        std::printf("cleave: --resume latest: skipping %s: %s\n", candidates[i].c_str(), e.what());
      opened.reset();
    }
  }
  if (!from.empty()) report_resume_reads(from);
  else if (!init_dir_.empty()) agree_on_errors([&] { load_init_from(); });

  if (rank_ == 0) {
    fs::create_directories(t.out_dir);
    std::ofstream(t.out_dir + "/config.toml") << to_toml(cfg_);
    metrics_.open(t.out_dir + "/metrics.jsonl", from.empty() ? std::ios::trunc : std::ios::app);
    if (!metrics_) throw Error("cannot write " + t.out_dir + "/metrics.jsonl");
  }

  resolve_peaks();
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
    request.precision = product_precision(cfg_.train.dtype);
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
  const int pp = process_.pp->size(), pp_rank = process_.pp->rank();
  const int n_stages = layout.schedule.n_stages;
  for (const int64_t m : {int64_t(layout.schedule.microbatches), cfg_.train.val_batches})
    if (2 * n_stages * m > 32768)
      throw EveryRankError("the pipeline's " + std::to_string(n_stages) + " stages x " +
                           std::to_string(m) + " micro-batches need more message tags than MPI "
                           "guarantees (32768 / 2): fewer micro-batches or stages");
  const UnitLayout units = unit_layout(*model_);
  const bool zero3 = cfg_.parallel.zero_stage == 3;
  const int n_groups = int(groups_.size());
  model_->set_selective_recompute(cfg_.train.activation_checkpointing == "selective");
  train_program_ = training_program(cfg_.train, cfg_.parallel, layout, pp_rank, *model_);
  val_program_ = lower_schedule(forward_only_schedule(stages, pp, int(cfg_.train.val_batches)),
                                stages, pp_rank, units, {zero3, false, n_groups, {}});
  {
    // Validation reuses the training step's sets (its own are given back block by block).
    const bool selective = cfg_.train.activation_checkpointing == "selective";
    const int64_t T = cfg_.train.seq_len / cp_;
    const ActivationMemory train = predict_activation_memory(*model_, train_program_, local_batch_, T, selective);
    const ActivationMemory val = predict_activation_memory(*model_, val_program_, local_batch_, T, selective);
    activations_ = train;
    activations_.slots = std::max(train.slots, val.slots);
    activations_.saved = std::max(train.saved, val.saved);
  }
  CLEAVE_CHECK((model_->pipeline_tied_tensor() >= 0) == bool(process_.tied),
               "the pp_tied group and the model disagree on where the tied embedding is");
  StepEndParts end;
  end.params = &model_->params();
  for (GroupParallel& part : groups_)
    end.groups.push_back({part.dp.get(), part.optim.get(), part.shard, part.spread});
  end.batch = process_.along(axes_.batch);
  end.pp = pp > 1 ? process_.pp.get() : nullptr;
  end.tp_grads = tp_grads_.get();
  end.zero_stage = cfg_.parallel.zero_stage;
  end.grad_clip = cfg_.optim.grad_clip;
  end.scaler = scaler_.get();
  end.model = model_.get();
  end.fp8 = fp8_.get();
  step_end_ = std::make_unique<StepEnd>(std::move(end));
  StepParts parts;
  parts.model = model_.get();
  parts.end = step_end_.get();
  for (GroupParallel& part : groups_) parts.dp.push_back(part.dp.get());
  parts.tp_grads = tp_grads_.get();
  parts.pp = process_.pp.get();
  parts.tied = process_.tied.get();
  parts.rank = rank_;
  parts.before_reduce = [this](int unit) {
    if (gradient_fault_) gradient_fault_(step_, unit, model_->params());
  };
  executor_ = std::make_unique<StepExecutor>(std::move(parts));
  schedule_name_ = layout.schedule.name;
  n_stages_ = n_stages;
  // Every stage's, and every ep rank's experts.
  double count = double(model_->params().global_count());
  for (int g = 0; g < n_groups; ++g)
    if (Group* spread = groups_[size_t(g)].spread)
      count += double(model_->params().global_count(g)) * (spread->size() - 1);
  if (pp > 1) count = sum_of_doubles(*process_.pp, count);
  global_params_ = std::llround(count);
}

std::string Trainer::pipeline_description() const {
  const int pp = process_.pp->size();
  if (pp == 1) return "";
  return " x pp " + std::to_string(pp) + " (" + schedule_name_ + ", " + std::to_string(n_stages_) +
         " stages)";
}

StepResult Trainer::train_step(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t mb = t.micro_batch_size, T = t.seq_len, accum = t.grad_accum_steps;
  // The mean over the global batch, times fp16's loss scale.
  const float grad_scale = scaler_ ? float(scaler_->scale() / double(mb * T * accum))
                                   : 1.0f / float(mb * T * accum);
  // What validation waited on and sent belongs to no step.
  for (GroupParallel& part : groups_) part.dp->take_gather_bytes();
  for (auto& [axis, meter] : meters_) meter->take_exposed_seconds(), meter->take_bytes();
  for (GroupParallel& part : groups_) part.dp->zero_gradients();
  StepRun run;
  run.B = local_batch_;
  run.T = T / cp_;
  run.grad_scale = grad_scale;
  run.trace = t.trace_step == step + 1;
  run.fill = [this, step, mb](int micro, Batch& batch) {
    train_loader_->fill(batch, uint64_t(step), micro * mb + dp_rank_ * local_batch_, local_batch_);
  };
  run.step = step;
  run.lr = learning_rate(cfg_.optim, step, t.steps);
  // Every target of the loader's windows counts: the step's valid tokens are its global batch's.
  run.loss_tokens = double(mb * T * accum);
  if (run.trace) begin_comm_capture();
  const StepTimes times = executor_->run(train_program_, run);
  StepResult r;
  r.loss = times.end.loss;
  r.lr = run.lr;
  r.grad_norm = times.end.grad_norm;
  r.loss_scale = times.end.loss_scale;
  r.skipped = times.end.skipped;
  if (r.skipped && rank_ == 0)
    std::printf("step %lld | skipped: the gradients overflowed at loss scale %g; the scale is now "
                "%g\n", (long long)(step + 1), r.loss_scale, scaler_->scale());
  r.comm = times.comm;
  r.comm += times.end.comm;
  for (auto& [axis, meter] : meters_) meter->take_into(r.comm[axis]);
  for (GroupParallel& part : groups_) r.gather_bytes += part.dp->take_gather_bytes();
  r.busy_s = times.busy_seconds;
  r.program_s = times.seconds;
  for (const MoeLayerStats& s : step_end_->moe_layer_stats()) {
    r.expert_rows[s.layer] = s.kept;
    r.dropped_rows[s.layer] = s.dropped;
  }
  if (run.trace) {
    std::vector<TraceEvent> events = times.trace;
    for (const CommRecord& c : end_comm_capture())
      events.push_back({rank_, c.op + " " + c.group, 1e6 * (c.started - times.started),
                        1e6 * (c.ended - c.started), c.bytes, c.group});
    write_trace(step + 1, events);
  }
  return r;
}

double Trainer::validate() {
  StepRun run;
  run.B = local_batch_;
  run.T = cfg_.train.seq_len / cp_;
  run.fill = [this](int b, Batch& batch) {
    val_loader_->fill(batch, uint64_t(b), dp_rank_ * local_batch_, local_batch_);
  };
  const StepTimes v = executor_->run(val_program_, run);
  if (fp8_) fp8_->discard();
  Group* pp = process_.pp->size() > 1 ? process_.pp.get() : nullptr;
  return sum_losses(*process_.along(axes_.batch), pp, v.loss_sum, double(v.loss_tokens)).mean();
}

void Trainer::write_trace(int64_t step, const std::vector<TraceEvent>& mine) {
  // Every rank's spans at rank 0, one track per world rank.
  nlohmann::json list = nlohmann::json::array();
  for (const TraceEvent& e : mine)
    list.push_back({e.name, e.start_us, e.duration_us, e.bytes, e.group});
  const std::vector<std::string> all = gather_strings(list.dump(), rank_, world_);
  if (rank_ != 0) return;
  std::vector<TraceEvent> events;
  for (int r = 0; r < world_; ++r)
    for (const nlohmann::json& e : nlohmann::json::parse(all[size_t(r)]))
      events.push_back({r, e[0].get<std::string>(), e[1].get<double>(), e[2].get<double>(),
                        e[3].get<int64_t>(), e[4].get<std::string>()});
  const std::string path = cfg_.train.out_dir + "/trace_step_" + std::to_string(step) + ".json";
  write_chrome_trace(path, events);
  std::printf("wrote %s\n", path.c_str());
}

void Trainer::run(int64_t exit_after) {
  const TrainConfig& t = cfg_.train;
  // mpirun binds each rank to one core by default when ranks <= 2, and srun (with Slurm's
  // task/affinity) to its --cpus-per-task CPUs, one by default: the OpenMP threads then share
  // them, which halves a 2-thread rank's speed without any other sign.
  cpu_set_t cpus;
  const bool bound = sched_getaffinity(0, sizeof cpus, &cpus) == 0;
  const bool srun = launcher() == Launcher::srun;
  const int threads = omp_get_max_threads();
  if (bound && CPU_COUNT(&cpus) < threads)
    std::fprintf(stderr, "cleave: warning: rank %d may run on %d CPU(s) but uses %d threads; %s\n",
                 rank_, CPU_COUNT(&cpus), threads,
                 (srun ? "under srun pass --cpus-per-task=" + std::to_string(threads) +
                             " (or --cpu-bind=none)"
                       : "under mpirun pass --bind-to none or --map-by slot:PE=" +
                             std::to_string(threads)).c_str());
  else if (bound && CPU_COUNT(&cpus) == 1 && world_ > 1 && rank_ == 0 &&
           sysconf(_SC_NPROCESSORS_ONLN) > 1)
    // Even one thread shares its core then, with the progress thread that drives its
    // collectives (docs/data_parallel.md: unbound, DDP 2 x 1 ran 9-33% faster on a 2-core Zen 4,
    // and up to twice as fast on a 2-core Zen 5 VM, whose cores run a pinned thread slower).
    std::fprintf(stderr,
                 "cleave: note: rank 0 is bound to one CPU, which its communication progress "
                 "thread shares with its compute thread; %s is faster where ranks have no spare "
                 "core (DDP 2 x 1 on 2 cores: 1.1-2x, docs/data_parallel.md)\n",
                 srun ? "under srun --cpu-bind=none" : "under mpirun --bind-to none");
  if (rank_ == 0) {
    std::cout << "cleave: " << family_name(cfg_.model.family) << " model, "
              << global_params_ << " parameters, "
              << precision_name(t.dtype) << ", " << world_ << " rank"
              << (world_ > 1 ? "s" : "") << " (dp_replicate " << process_.replicate->size()
              << " x dp_shard " << process_.shard->size()
              << (cp_ > 1 ? " x cp " + std::to_string(cp_) + " (" +
                                cp_mode_name(process_.context.mode) + ")"
                          : "")
              << " x tp " << process_.tp->size()
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
    if ((t.dtype == Precision::bf16 || t.dtype == Precision::fp8) && !native_bf16_products())
      std::cout << "bf16 products emulated in fp32 (this CPU's oneDNN makes no bf16 matmul, or "
                   "CLEAVE_EMULATE_BF16=1): the same values, fp32's speed and peak\n";
    // What the layout should send, so a setting the run ignored shows beside the measured figure.
    std::cout << "predicted bytes per step, rank 0:";
    for (CommAxis a : kCommAxes)
      if (predicted_[a].bytes > 0) std::cout << " " << comm_axis_name(a) << " " << predicted_[a].bytes;
    std::cout << "\n";
    const double mib = 1.0 / (1 << 20);
    std::printf("predicted activation memory, rank 0: %.1f MiB (saved for backward %.1f MiB at "
                "the peak, %d micro-batch blocks whole and %d checkpointed selectively; slots "
                "%.1f MiB)\n",
                double(activations_.total()) * mib, double(activations_.saved) * mib,
                activations_.sets_whole, activations_.sets_kept, double(activations_.slots) * mib);
    std::fflush(stdout);
    if (step_ > 0) std::cout << "resumed at step " << step_ << "\n";
    if (!init_dir_.empty())
      std::cout << "initialised from " << init_dir_
                << " (train.init_from): its parameters, a fresh optimizer, step 0\n";
    for (const std::string& change : init_changes_)
      std::cout << "train.init_from: " << change << "\n";
    if (t.async_checkpoint)
      std::cout << "checkpoints: the state copied at the step's end, the files written in the "
                   "background (train.async_checkpoint)\n";
    if (t.checkpoint_on_signal)
      std::cout << "checkpoints: SIGTERM saves one at the next step's end, then the run exits "
                   "(train.checkpoint_on_signal)\n";
    std::cout << std::flush;
    for (const std::string& change : resume_changes_)
      std::cout << "resume: " << change << ": the batches from step " << step_ + 1
                << " on are not those the checkpointed run would have drawn\n";
  }
  // Throughput counts the training steps' own time: validation and checkpoints are left out.
  double interval_seconds = 0;
  StepResult interval;  // sums over the interval's steps
  int64_t interval_steps = 0;
  const int64_t first_step = step_;
  bool stopped_by_signal = false;
  while (step_ < t.steps) {
    const double t0 = now_seconds();
    const StepResult r = train_step(step_);
    const double step_seconds = now_seconds() - t0;
    elapsed_ += step_seconds;
    interval_seconds += step_seconds;
    ++steps_timed_;
    ++step_;
    ++interval_steps;
    interval.comm += r.comm;
    interval.gather_bytes += r.gather_bytes;
    interval.busy_s += r.busy_s;
    interval.program_s += r.program_s;
    for (const auto& [layer, rows] : r.expert_rows) {
      std::vector<double>& sum = interval.expert_rows[layer];
      sum.resize(rows.size());
      for (size_t e = 0; e < rows.size(); ++e) sum[e] += rows[e];
      interval.dropped_rows[layer] += r.dropped_rows.at(layer);
    }
    if (step_ % t.log_interval == 0 || step_ == t.steps) {
      log_step(r, interval_seconds, interval_steps, interval);
      interval_seconds = 0;
      interval_steps = 0;
      interval = StepResult();
    }
    // A SIGTERM skips the step's validation: the scheduler's grace period goes to the save.
    const bool signalled = agree_at_step_end();
    if (!signalled && t.val_interval > 0 && (step_ % t.val_interval == 0 || step_ == t.steps)) {
      const double v = validate();
      if (rank_ == 0) {
        std::printf("step %lld | val loss %.4f\n", (long long)step_, v);
        metrics_ << nlohmann::json{{"step", step_}, {"val_loss", v}}.dump() << "\n" << std::flush;
      }
    }
    const bool exiting = exit_after > 0 && step_ - first_step == exit_after;
    const bool due = t.checkpoint_interval > 0 ? step_ % t.checkpoint_interval == 0 || step_ == t.steps
                                               : t.checkpoint_interval == 0 && step_ == t.steps;
    if (signalled && rank_ == 0) {
      std::printf("SIGTERM: saving checkpoint at step %lld before exit\n", (long long)step_);
      std::fflush(stdout);
    }
    if (due || exiting || signalled) save_checkpoint();
    stopped_by_signal = signalled;
    if (exiting || signalled) {
      if (rank_ == 0 && exiting)
        std::printf("exiting after %lld steps (--exit-after)\n", (long long)exit_after);
      break;
    }
  }
  complete_pending_save();
  if (rank_ == 0 && stopped_by_signal)
    std::printf("exiting at step %lld after SIGTERM (train.checkpoint_on_signal)\n",
                (long long)step_);
  std::fflush(stdout);
}

}  // namespace cleave
