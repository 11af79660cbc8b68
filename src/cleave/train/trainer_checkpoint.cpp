// The trainer's checkpoints: every writer's shard of the state into one temporary folder that
// rank 0 completes and swaps into place, at the step's end or in the background
// (train.async_checkpoint), and a resume that reads, on each rank, only what it keeps
// (docs/checkpoints.md); and train.init_from, which reads a checkpoint's parameters alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/base/file.h"
#include "cleave/checkpoint/folder.h"
#include "cleave/checkpoint/training_state.h"
#include "cleave/train/checkpoint_config.h"
#include "cleave/train/trainer.h"

namespace fs = std::filesystem;

namespace cleave {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A copy of `live`'s ranges in `into` (values, then m, then v, each packed): what a background
// save writes while training changes the live state. Bitwise the same floats, so the same files.
StateSlices snapshot(const StateSlices& live, Buffer<float>& into) {
  int64_t n = 0;
  for (const FlatRange& r : live.ranges) n += r.end - r.begin;
  float* out = into.grow(3 * n);
  // Copied in blocks of at most 1 MiB over the threads: the copy is most of the training
  // thread's stall.
  struct Block {
    const float* src;
    float* dst;
    int64_t len;
  };
  constexpr int64_t kBlock = int64_t(1) << 18;
  std::vector<Block> blocks;
  const RangeBuffer from[3] = {live.values, live.m, live.v};
  int64_t at = 0;  // where the range starts in a packed buffer
  for (const FlatRange& r : live.ranges) {
    const int64_t len = r.end - r.begin;
    for (int k = 0; k < 3; ++k) {
      const float* src = from[k].data + (from[k].packed ? at : r.begin);
      for (int64_t b = 0; b < len; b += kBlock)
        blocks.push_back({src + b, out + k * n + at + b, std::min(kBlock, len - b)});
    }
    at += len;
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < blocks.size(); ++i)
    std::memcpy(blocks[i].dst, blocks[i].src, size_t(blocks[i].len) * sizeof(float));
  return {live.ranges, {out, true}, {out + n, true}, {out + 2 * n, true}, live.copy};
}

// Keeps the newest `keep` step_N folders of out_dir.
void prune_checkpoints(const std::string& out_dir, int64_t keep) {
  std::vector<int64_t> steps;
  for (auto& e : fs::directory_iterator(out_dir)) {
    const std::string n = e.path().filename().string();
    if (n.size() == 13 && n.rfind("step_", 0) == 0 &&
        n.find_first_not_of("0123456789", 5) == std::string::npos)
      steps.push_back(std::stoll(n.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i)
    fs::remove_all(out_dir + "/" + checkpoint_name(steps[i]));
}

}  // namespace

void Trainer::save_checkpoint() {
  const double t0 = now_seconds();
  const TrainConfig& t = cfg_.train;
  ParamStore& params = model_->params();
  // At most one save in flight: its copies of the state are about to be overwritten.
  complete_pending_save();
  // Every writer puts its shard of the state into one temporary folder; rank 0 then checks the
  // files, records them in meta.json and swaps the folder into place. Nothing is gathered but
  // what each writer's file holds. Each pipeline rank and tp rank writes its own files (its
  // data-parallel shards).
  const std::string dir = t.out_dir + "/" + checkpoint_name(step_);
  const std::string tmp = checkpoint_temp_folder(dir, job_tag_);
  if (rank_ == 0) begin_checkpoint_folder(dir, job_tag_);
  process_.world->barrier().wait();
  // Files: a block per place on the model axes (pipeline stage, tp rank), in it each group's
  // data-parallel files one after the other.
  // A group spread over ranks (experts over ep) has its files once per spread rank.
  auto files_of = [](const GroupParallel& part) {
    return part.dp->checkpoint_files() * (part.spread ? part.spread->size() : 1);
  };
  int files_per_block = 0;
  for (GroupParallel& part : groups_) files_per_block += files_of(part);
  const int block = flat_coordinate(*mesh_, rank_, axes_.model);
  BackgroundSave::Checksums checksums;  // of the files this rank wrote (synchronous saves)
  std::vector<std::pair<int, StateSlices>> copies;  // what a background save writes
  nlohmann::json entries = nlohmann::json::array();
  int group_first = 0;
  for (GroupParallel& part : groups_) {
    const int own = part.dp->checkpoint_file();
    if (own >= 0) {
      const int spread = part.spread ? part.spread->rank() * part.dp->checkpoint_files() : 0;
      const int file = block * files_per_block + group_first + spread + own;
      const StateSlices state{part.dp->ranges(), part.dp->values(),
                              {part.optim->m(), true}, {part.optim->v(), true},
                              tp_grads_ ? tp_grads_->copy() : TpCopy{}};
      if (t.async_checkpoint) {
        if (copies.size() == snapshots_.size()) snapshots_.emplace_back();
        copies.push_back({file, snapshot(state, snapshots_[copies.size()])});
        entries.push_back({{"file", file}, {"tensors", state_file_entries(file, params, state)}});
      } else {
        // Its checksums go to rank 0 with its pieces: rank 0 reads no other rank's file back.
        checksums[file] = write_state_file(tmp, file, params, state);
        entries.push_back({{"file", file},
                           {"tensors", state_file_entries(file, params, state)},
                           {"checksums", checksums[file].to_json()}});
      }
      part.optim->drop_offloaded();
      part.dp->drop_offloaded();
    }
    group_first += files_of(part);
  }
  const std::vector<std::string> listed = gather_strings(entries.dump(), rank_, world_);
  // sigmoid_bias's router biases: every stage's layers (the same on every rank of a stage).
  nlohmann::json biases = nlohmann::json::object();
  for (const auto& [layer, bias] : model_->moe_biases()) biases[std::to_string(layer)] = *bias;
  const std::vector<std::string> bias_of_rank = gather_strings(biases.dump(), rank_, world_);
  // Rank 0's completion, from what the step's end holds: it may run after training went on.
  std::function<void(const BackgroundSave::Checksums&)> finish;
  if (rank_ == 0) {
    std::vector<nlohmann::json> entries_of_file(
        size_t(files_per_block * flat_size(*mesh_, axes_.model)));
    BackgroundSave::Checksums written;  // the synchronous writers'
    for (const std::string& e : listed)
      for (const nlohmann::json& j : nlohmann::json::parse(e)) {
        entries_of_file[j["file"].get<size_t>()] = j["tensors"];
        if (j.contains("checksums"))
          written[j["file"].get<int>()] =
              FileChecksums::from_json(j["checksums"], "a writer's checksums");
      }
    nlohmann::json moe_bias = nullptr;
    for (const std::string& b : bias_of_rank) {
      const nlohmann::json layers = nlohmann::json::parse(b);
      for (const auto& [layer, values] : layers.items()) moe_bias[layer] = values;
    }
    const std::optional<LossScalerState> scaler =
        scaler_ ? std::optional<LossScalerState>(scaler_->state()) : std::nullopt;
    const std::optional<Fp8ScalingState> fp8 =
        fp8_ ? std::optional<Fp8ScalingState>(fp8_->state()) : std::nullopt;
    // A background save's other writers report no checksums: rank 0 reads their files back.
    finish = [dir, tag = job_tag_, config = to_toml(cfg_), seed = t.seed, step = step_,
              entries_of_file = std::move(entries_of_file), written = std::move(written),
              optimizer_steps = groups_.front().optim->steps_taken(), world = world_, scaler,
              moe_bias = std::move(moe_bias), fp8, out_dir = t.out_dir,
              keep = t.keep_checkpoints](const BackgroundSave::Checksums& own) {
      BackgroundSave::Checksums all = written;
      all.insert(own.begin(), own.end());
      finish_training_checkpoint(dir, tag, config, seed, step, entries_of_file, all,
                                 optimizer_steps, world, scaler ? &*scaler : nullptr, moe_bias,
                                 fp8 ? &*fp8 : nullptr);
      prune_checkpoints(out_dir, keep);
    };
  }
  if (t.async_checkpoint) {
    auto write = [tmp, &params, copies = std::move(copies)] {
      BackgroundSave::Checksums own;
      for (const auto& [file, state] : copies) own[file] = write_state_file(tmp, file, params, state);
      return own;
    };
    pending_save_ = std::make_unique<BackgroundSave>(step_, now_seconds() - t0, std::move(write),
                                                     std::move(finish));
    return;
  }
  if (rank_ == 0) {
    finish(checksums);
    std::printf("saved checkpoint %s (stall %.1f ms)\n", dir.c_str(), 1e3 * (now_seconds() - t0));
  }
  process_.world->barrier().wait();  // nobody looks for the checkpoint before it is complete
}

bool Trainer::agree_at_step_end() {
  const bool writing = pending_save_ && !pending_save_->agreed();
  bool signalled = false;
  if (cfg_.train.checkpoint_on_signal || writing) {
    const std::vector<float> any = max_over(
        *process_.world, {sigterm_received() ? 1.0f : 0.0f,
                          writing && !pending_save_->written() ? 1.0f : 0.0f});
    signalled = any[0] > 0;
    if (writing && any[1] == 0) pending_save_->all_written();
  }
  if (pending_save_ && pending_save_->done()) report_background_save();
  return signalled;
}

void Trainer::complete_pending_save() {
  if (!pending_save_) return;
  if (!pending_save_->agreed()) {
    // Each rank's writer, then every rank's: rank 0 completes the folder only after all of them.
    pending_save_->wait_written();
    process_.world->barrier().wait();
    pending_save_->all_written();
  }
  report_background_save();
}

void Trainer::report_background_save() {
  pending_save_->wait();
  if (rank_ == 0)
    std::printf("saved checkpoint %s/%s (async, stall %.1f ms, written in the background in "
                "%.0f ms)\n",
                cfg_.train.out_dir.c_str(), checkpoint_name(pending_save_->step()).c_str(),
                1e3 * pending_save_->stall_seconds(), 1e3 * pending_save_->busy_seconds());
  pending_save_.reset();
}

void Trainer::load_checkpoint(const std::string& dir, std::optional<LoadedCheckpoint> opened) {
  // Each rank reads only what it keeps, from whichever files hold it: any layout resumes any other.
  const int64_t kernel_before = process_bytes_read();
  const uint64_t opened_bytes = opened ? opened->bytes_read() : 0;  // read before kernel_before
  const LoadedCheckpoint ck = opened ? std::move(*opened) : read_checkpoint_folder(dir);
  step_ = checkpoint_step(ck, dir, cfg_);
  resume_changes_ = resume_changes(ck, dir, cfg_);
  double kept = read_parameters(ck, dir);
  ParamStore& params = model_->params();
  for (int g = 0; g < params.n_groups(); ++g) {
    GroupParallel& part = groups_[size_t(g)];
    // The optimizer state is this rank's ranges.
    for (const FlatRange& r : part.dp->ranges()) kept += 8.0 * double(r.end - r.begin);  // m, v
    read_state(ck, dir, params, "adam_m", part.dp->ranges(), {part.optim->m(), true});
    read_state(ck, dir, params, "adam_v", part.dp->ranges(), {part.optim->v(), true});
    part.optim->drop_offloaded();
    part.optim->set_steps_taken(checkpoint_optimizer_steps(ck, dir));
  }
  // A run that was not fp16 leaves the scaler at its initial state.
  if (scaler_)
    if (const auto state = checkpoint_loss_scaler(ck, dir)) scaler_->restore(*state);
  // Likewise delayed FP8 scaling starts afresh after a run without its history.
  if (fp8_ && fp8_->delayed())
    if (const std::optional<Fp8ScalingState> state = checkpoint_fp8_state(ck, dir);
        state && state->delayed)
      fp8_->restore(*state, "checkpoint " + dir);
  const int64_t kernel_after = process_bytes_read();
  resume_reads_ = {double(ck.bytes_read() - opened_bytes),
                   kernel_before < 0 ? -1.0 : double(kernel_after - kernel_before), kept};
}

void Trainer::report_resume_reads(const std::string& dir) {
  const double mine[3] = {resume_reads_.counted, resume_reads_.kernel, resume_reads_.kept};
  std::vector<double> all(3 * size_t(world_));
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank_ != 0) return;
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) on_disk += e.file_size();
  auto list = [&](int k) {
    std::string out;
    char buf[32];
    for (int r = 0; r < world_; ++r) {
      std::snprintf(buf, sizeof buf, "%s%.3f", r ? " " : "", all[3 * size_t(r) + size_t(k)] / (1 << 20));
      out += buf;
    }
    return out;
  };
  std::printf("resume read per rank (MiB, of %.3f in %s): %s; kernel-counted %s; state kept %s\n",
              double(on_disk) / (1 << 20), dir.c_str(), list(0).c_str(), list(1).c_str(),
              list(2).c_str());
}

double Trainer::read_parameters(const LoadedCheckpoint& ck, const std::string& dir) {
  ParamStore& params = model_->params();
  double bytes = 0;
  for (int g = 0; g < params.n_groups(); ++g) {
    GroupParallel& part = groups_[size_t(g)];
    // Below ZeRO-3 every rank holds the group's whole values; ZeRO-3 its ranges.
    const std::vector<FlatRange> region = {
        {params.unit_bounds(g).front(), params.unit_bounds(g).back()}};
    const RangeBuffer values = part.dp->values();
    const std::vector<FlatRange>& ranges = values.packed ? part.dp->ranges() : region;
    for (const FlatRange& r : ranges) bytes += 4.0 * double(r.end - r.begin);
    read_state(ck, dir, params, "param", ranges, values);
    part.dp->drop_offloaded();
  }
  params.wrote_all();
  read_moe_biases(ck, dir, model_->moe_biases());
  return bytes;
}

std::string Trainer::init_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw Error("train.init_from = " + path + ": " +
                (fs::exists(path, ec) ? "not a folder" : "no such folder"));
  if (fs::exists(path + "/meta.json", ec)) return path;
  const std::string latest = latest_checkpoint(path);
  if (latest.empty())
    throw Error("train.init_from = " + path + ": neither a checkpoint (it has no meta.json) nor " +
                "a run folder with one");
  return latest;
}

void Trainer::load_init_from() {
  const std::string& dir = init_dir_;
  try {
    const LoadedCheckpoint ck = read_checkpoint_folder(dir);
    // The whole model's tensors, not only this rank's: a checkpoint of another width or depth
    // fails on every rank alike, naming the tensor, before anything is read.
    const std::unique_ptr<Transformer> whole = Transformer::planned(cfg_.model, 1, false);
    check_saved_shapes(ck, dir, whole->params(), "param");
    std::set<std::string> names;
    for (const ParamTensor& t : whole->params().tensors()) names.insert("param/" + t.name);
    for (const auto& [name, entry] : ck.meta["tensors"].items())
      if (name.rfind("param/", 0) == 0 && !names.count(name))
        throw Error("checkpoint " + dir + " has tensor " + name +
                    ", which the model of this config does not");
    read_parameters(ck, dir);
    init_changes_ = model_differences(ck, dir, cfg_);
  } catch (const Error& e) {
    throw Error("train.init_from = " + cfg_.train.init_from + ": " + e.what());
  }
}

}  // namespace cleave
