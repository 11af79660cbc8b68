// What one rank of a training layout holds in memory, predicted before anything runs
// (docs/planner.md, Memory): the model's parameters, gradients and optimizer state as the
// data-parallel family shards them (parallel/data_parallel.h), the copies of the weights its
// products keep (LinearGemm::weight_copy_bytes), and the activations its step program holds at
// its peak (parallel/activation_memory.h), walked from the same lowered program the trainer runs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/model/model_config.h"
#include "cleave/parallel/activation_memory.h"
#include "cleave/parallel/layout.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"
#include "cleave/plan/step_work.h"

namespace cleave {

// Bytes per parameter of each part of the model state. cleave's: fp32 values, fp32 gradients and
// AdamW's two fp32 moments. The ZeRO paper's mixed-precision recipe: fp16 values and gradients,
// 12 bytes of optimizer state (fp32 master copy, momentum, variance).
struct StateRecipe {
  double values = 4, gradients = 4, optimizer = 8;
};
inline constexpr StateRecipe kZeroPaperRecipe{2, 2, 12};

// A rank's model state under ZeRO stage `zero`, in parameters: `all` of the rank's model share,
// `shard` its ZeRO shard of them; `gathered`: ZeRO-3's units resident at once beside the shard
// (the one in use and the one prefetched); `reducing`: ZeRO-2/3's full gradients of the units
// awaiting their reduce-scatter, or all of them while accumulation sums into the whole buffer.
struct ModelState {
  double values = 0, gradients = 0, optimizer = 0;
  double total() const { return values + gradients + optimizer; }
};
ModelState model_state(const StateRecipe& recipe, int zero, double all, double shard,
                       double gathered, double reducing);

// The bytes of model state a rank of `parallel` keeps in memory (model_state, cleave's recipe),
// less what offloading keeps in files: ZeRO-3's parameter shard (parallel.offload_params) and
// AdamW's moments (optimizer_offload = "file").
ModelState resident_state(const ParallelConfig& parallel, const std::string& optimizer_offload,
                          double all, double shard, double gathered, double reducing);

struct MemoryPlan {
  int pp_rank = 0;
  int64_t parameter_count = 0;  // of this rank's share of the model (tp share of its stages)
  int64_t parameters = 0;       // fp32 values resident: all, or ZeRO-3's shard and gathered units
  int64_t gradients = 0;        // fp32: all, or ZeRO-2/3's shard and the units being reduced
  int64_t optimizer = 0;        // AdamW's two moments: all, or ZeRO-1/2/3's shard (0 offloaded)
  int64_t weight_copies = 0;    // rounded and packed copies of the linears' weights
  ActivationMemory activations;  // the training (or validation) program's peak, the larger
  int64_t backward_scratch = 0;   // the blocks' shared backward buffers (BlockGrads)
  int64_t product_scratch = 0;    // the linears' per-thread work buffers (conversions, FP8's)
  int64_t comm_buffers = 0;       // the communication engine's scratch (ring reductions' staging)
  // What the figure leaves out, by name (offloaded state, ...), for the report.
  std::vector<std::string> notes;
  int64_t total() const {
    return parameters + gradients + optimizer + weight_copies + activations.total() +
           backward_scratch + product_scratch + comm_buffers;
  }
};

// The plan of a pp rank (its tp rank 0 and data-parallel rank 0 stand for the others, which hold
// as much) of a layout from plan_layout, from the rank's step (`work`, step_work's: its program
// and collectives). val_batches: validation's micro-batches (0: none), whose forward-only program
// may hold more activations than training's.
MemoryPlan plan_memory(const ModelConfig& model, const ParallelConfig& parallel,
                       const StepOptions& step, const std::string& optimizer_offload,
                       const Layout& layout, const StepWork& work, int val_batches);

}  // namespace cleave
