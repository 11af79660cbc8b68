// The training loop: batches from the loader (each data-parallel rank its slice of the global
// batch), the step as a program of instructions (the pipeline schedule's actions on this rank's
// stages, with gradient synchronisation between them), global-norm clipping, AdamW on this rank's
// shard, the learning-rate schedule, progress lines and JSON metrics (rank 0), validation and
// checkpoints.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/checkpoint/folder.h"
#include "cleave/comm/group.h"
#include "cleave/data/loader.h"
#include "cleave/mesh/mesh.h"
#include "cleave/model/transformer.h"
#include "cleave/optim/adamw.h"
#include "cleave/parallel/activation_memory.h"
#include "cleave/parallel/axis_table.h"
#include "cleave/parallel/comm_meter.h"
#include "cleave/parallel/data_parallel.h"
#include "cleave/parallel/fp8_scaling.h"
#include "cleave/parallel/layout.h"
#include "cleave/parallel/process_groups.h"
#include "cleave/parallel/step_executor.h"
#include "cleave/parallel/tensor_parallel.h"
#include "cleave/train/background_save.h"
#include "cleave/train/config.h"
#include "cleave/train/peak.h"

namespace cleave {

struct StepResult {
  double loss = 0, lr = 0, grad_norm = 0;
  CommTraffic comm;           // per mesh axis: seconds waited, bytes sent
  int64_t gather_bytes = 0;   // ZeRO-3: bytes this rank's shards sent into parameter gathers
  double busy_s = 0, program_s = 0;  // in compute instructions, in the whole step program
  double loss_scale = 1;  // fp16: the scale the step's gradients were made at
  bool skipped = false;   // fp16: its gradients overflowed and nothing was updated
  // MoE: per layer of this rank's stage, the rows each expert kept over the batch (global counts;
  // what `cleave plan --routing` predicts ep's bytes from), and the choices dropped.
  std::map<int, std::vector<double>> expert_rows;
  std::map<int, double> dropped_rows;
};

class Trainer {
 public:
  // resume: "" to start fresh, "latest" for the newest checkpoint in out_dir, or a folder.
  Trainer(const Config& cfg, const std::string& resume);
  // Trains up to train.steps; with exit_after > 0, stops after that many steps of this run and
  // saves a checkpoint (a planned interruption, like Megatron's --exit-interval).
  void run(int64_t exit_after = 0);
  StepResult train_step(int64_t step);
  double validate();
  // Saves a checkpoint of the steps completed: synchronously, or with train.async_checkpoint
  // started in the background (a save still in flight completes first).
  void save_checkpoint();
  int64_t step() const { return step_; }
  // Fault injection for tests: called with (step, unit) on this rank once backward has finished a
  // unit's gradients and before they are reduced, so a test can poison one rank's gradients.
  using GradientFault = std::function<void(int64_t step, int unit, ParamStore& params)>;
  void inject_gradient_fault(GradientFault fault) { gradient_fault_ = std::move(fault); }

 private:
  // opened: dir already read and verified (--resume latest), else it is read here.
  void load_checkpoint(const std::string& dir, std::optional<LoadedCheckpoint> opened);
  // Rank 0 prints what each rank read of the checkpoint it resumed from (collective).
  void report_resume_reads(const std::string& dir);
  // The parameters (and router biases) this rank holds, from a checkpoint of any layout; returns
  // their bytes.
  double read_parameters(const LoadedCheckpoint& ck, const std::string& dir);
  // train.init_from: the checkpoint folder it names (a run folder's newest), or an error naming
  // the key; then its parameters, once the whole model's shapes are checked against it.
  static std::string init_checkpoint(const std::string& path);
  void load_init_from();
  // At every step's end, where needed, one collective tells every rank whether any rank received
  // SIGTERM (train.checkpoint_on_signal; the return value) and whether every rank has written its
  // files of the background save, which rank 0 then completes in the background.
  bool agree_at_step_end();
  // Waits for the background save, if any, to be complete on every rank (collective while its
  // files are being written).
  void complete_pending_save();
  void report_background_save();  // rank 0, once it is complete
  void log_step(const StepResult& r, double seconds, int64_t steps_in_interval,
                const StepResult& interval);
  // Rank 0: the MoE fields of the progress line and metrics.jsonl, from every stage's layers.
  std::string moe_metrics(nlohmann::json& record);
  void make_pipeline(const Layout& layout);  // the model's chunks, programs and executor
  void write_trace(int64_t step, const std::vector<TraceEvent>& mine);
  std::string pipeline_description() const;  // for the start line
  void resolve_peaks();

  Config cfg_;
  int world_ = 1, rank_ = 0;
  int cp_ = 1;  // context-parallel degree: each rank holds seq_len / cp_ tokens of a sequence
  std::unique_ptr<Mesh> mesh_;
  ProcessGroups process_;
  std::unique_ptr<TensorParallelGrads> tp_grads_;  // tp > 1
  int dp_size_ = 1, dp_rank_ = 0;
  int64_t local_batch_ = 0;  // samples of each micro-batch on this rank
  std::unique_ptr<TokenShard> train_shard_, val_shard_;
  std::unique_ptr<BatchLoader> train_loader_, val_loader_;
  std::unique_ptr<Transformer> model_;
  // Per parameter group (ParamStore::add_group): its data parallelism over the axes the group
  // maps to, and its optimizer.
  struct GroupParallel {
    std::unique_ptr<DataParallel> dp;
    std::unique_ptr<AdamW> optim;
    Group* shard = nullptr;  // the ranks its ZeRO shards are spread over
    Group* spread = nullptr;  // the ranks holding the group's other tensors (experts over ep)
  };
  AxisTable axes_;  // per parameter group, the axes of its reduction and sharding
  std::vector<GroupParallel> groups_;
  // Every communicator's meter and the axis its traffic counts on (the kv replicas' sums are tp's).
  std::vector<std::pair<CommAxis, CommMeter*>> meters_;
  CommTraffic predicted_;  // rank 0: the bytes per step plan/axis_volume.h predicts on each axis
  // This rank's activation memory as parallel/activation_memory.h predicts it for its programs.
  ActivationMemory activations_;
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16
  std::unique_ptr<Fp8Scaling> fp8_;            // fp8 with per-tensor scales
  std::unique_ptr<StepEnd> step_end_;
  // The step as instructions (pipeline/program.h), and validation's forward-only program.
  Program train_program_, val_program_;
  std::unique_ptr<StepExecutor> executor_;
  std::string schedule_name_;
  int n_stages_ = 1;
  int64_t global_params_ = 0;  // of the whole model, over every pipeline stage
  int64_t step_ = 0;  // steps completed
  std::vector<std::string> resume_changes_;  // what the config changes in the resumed run's data
  // What this rank's resume read: bytes by cleave's count and the kernel's (read syscalls), and
  // the bytes of state it keeps.
  struct ResumeReads {
    double counted = 0, kernel = 0, kept = 0;
  } resume_reads_;
  std::string init_dir_;  // train.init_from's checkpoint, when the run starts from it
  std::vector<std::string> init_changes_;  // the [model] keys the run sets otherwise than it
  std::string job_tag_;  // rank 0's pid: names the temporary folder all ranks write a checkpoint to
  // train.async_checkpoint: the copies of the state the save in flight writes from, one per file
  // this rank writes, kept from save to save (no page faults after the first); and that save (on
  // rank 0 until meta.json is in place, elsewhere until every rank's files are written), declared
  // after what its threads read so that it goes first.
  std::vector<Buffer<float>> snapshots_;
  std::unique_ptr<BackgroundSave> pending_save_;
  ComputePeak peak_;                  // this rank's (rank 0's is printed)
  double peak_sum_ = 0, hardware_sum_ = 0;  // GF/s over every rank: MFU's denominators
  bool warned_peak_ = false;
  GradientFault gradient_fault_;
  std::ofstream metrics_;
  double elapsed_ = 0;  // training seconds so far in this process
  int64_t steps_timed_ = 0;
};

// Peak resident memory of this process, MiB.
double peak_rss_mib();

}  // namespace cleave
