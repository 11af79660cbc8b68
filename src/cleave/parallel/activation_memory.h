// The activation memory a rank's step program needs, predicted before it runs: what each block
// says it saves per micro-batch (model/saved_bytes.h) walked through the program's instructions,
// so that activation checkpointing (which sets exist at once), the pipeline schedule (how many
// micro-batches are in flight) and the chunked loss (the logits' rows) all show in one figure
// that the run prints beside its measured peak memory (docs/activation_memory.md).
#pragma once
#include <cstdint>

#include "cleave/model/transformer.h"
#include "cleave/pipeline/program.h"

namespace cleave {

struct ActivationMemory {
  int64_t slots = 0;   // the slots' buffers (streams, gradients between units, the head's)
  int64_t saved = 0;   // the blocks' saved activations at their peak in the step
  int sets_whole = 0;  // at that peak: block micro-batches holding all they save,
  int sets_kept = 0;   // and holding only selective checkpointing's kept part
  int64_t total() const { return slots + saved; }
};

// program: a training (or forward-only) program of `model` for micro-batches of B x T tokens;
// selective: its dropped activations keep the products' outputs (Transformer's
// set_selective_recompute).
ActivationMemory predict_activation_memory(const Transformer& model, const Program& program,
                                           int64_t B, int64_t T, bool selective);

}  // namespace cleave
