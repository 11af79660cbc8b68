// A checkpoint's config against the run's, for the trainer's resume: the [model] table must match,
// and what differs in the keys that order the data is reported. For train.init_from only the
// shapes must match (check_saved_shapes); the other [model] keys that differ are reported.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/checkpoint/folder.h"
#include "cleave/train/config.h"

namespace cleave {

// Checks that the checkpoint's [model] matches cfg's; returns the checkpoint's step.
int64_t checkpoint_step(const LoadedCheckpoint& ck, const std::string& dir, const Config& cfg);
// What resuming under cfg changes in the run's data: a train.seed (it keys every batch), seq_len
// or global batch (micro_batch_size x grad_accum_steps) other than the checkpoint's, one line
// each. Each is a legitimate choice (a new seed steps past a loss spike, as Megatron-LM users
// skip data; a new batch size follows a ramp), so the caller prints them instead of refusing.
std::vector<std::string> resume_changes(const LoadedCheckpoint& ck, const std::string& dir,
                                        const Config& cfg);
// The [model] keys cfg sets otherwise than the checkpoint's config, one line each ("model.KEY =
// THIS in this run, THAT in checkpoint DIR"): a run from its parameters may change them (a longer
// context, another router), and should see that it does (an imported model's rope_theta).
std::vector<std::string> model_differences(const LoadedCheckpoint& ck, const std::string& dir,
                                           const Config& cfg);

}  // namespace cleave
