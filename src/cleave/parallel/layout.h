// How a training job's ranks divide the work: a pure function of the model, the [parallel] and
// step options and the world size, with no MPI, so that every rank checks it before any rank
// communicates (a bad layout is then one error, agreed on and reported once; see
// cleave/comm/errors.h). The trainer builds its groups from it.
#pragma once
#include <vector>

#include "cleave/mesh/mesh.h"
#include "cleave/model/cp_comm.h"
#include "cleave/model/model_config.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/parallel_config.h"
#include "cleave/parallel/step_options.h"
#include "cleave/pipeline/program.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

struct Layout {
  Mesh mesh;
  int64_t local_batch;  // samples of each micro-batch on one data-parallel rank
  // The pipeline: the step's schedule (the trivial one-stage loop without pp), checked, and the
  // layers of each stage in stage order.
  Schedule schedule;
  ScheduleCheck check;
  std::vector<int> stage_layers;
  // Context parallelism: its mode and the ranks of a Ulysses all-to-all (cp in ulysses mode,
  // parallel.cp_ulysses in hybrid mode, else 1).
  CpMode cp_mode = CpMode::ring;
  int cp_ulysses = 1;
};

// The pipeline part of a layout: the schedule `parallel` names for pp ranks and `microbatches`,
// checked, and the layers of each of its stages. Throws cleave::Error when the schedule cannot run
// or the layers do not split over its stages.
struct PipelinePlan {
  Schedule schedule;
  ScheduleCheck check;
  std::vector<int> stage_layers;
};
PipelinePlan plan_pipeline(const ModelConfig& model, const ParallelConfig& parallel, int pp,
                           int microbatches);

// The rest of a layout: the mesh with its carved axes, each data-parallel rank's share of a
// micro-batch and the cp mode. Throws cleave::Error naming the keys and numbers when they cannot
// be: a mesh axis this build does not have, degrees that do not make up the world, heads or a
// vocabulary that do not split over tp, a micro-batch the data-parallel ranks cannot split evenly.
struct MeshPlan {
  Mesh mesh;
  int64_t local_batch;
  CpMode cp_mode;
  int cp_ulysses;
};
MeshPlan plan_mesh(const ModelConfig& model, const ParallelConfig& parallel,
                   const StepOptions& step, int world);

// The layout of a mesh plan and a pipeline plan made for its pp degree.
Layout layout_of(MeshPlan mesh, const PipelinePlan& pipeline);

// plan_mesh's and plan_pipeline's (for the config's pp and grad_accum_steps) together, or their
// error: the config cannot run on `world` ranks.
Layout plan_layout(const ModelConfig& model, const ParallelConfig& parallel,
                   const StepOptions& step, int world);

// Stage `stage` of layers split as stage_layers (per stage, in order): its layers, and the
// embeddings on the first stage, the head on the last.
ModelChunk stage_chunk(const std::vector<int>& stage_layers, int stage);
// The stages pp rank `rank` runs, as chunks of consecutive layers (what its model holds).
std::vector<ModelChunk> stage_chunks(const Layout& layout, int rank);

// The training step program pp rank `rank` runs on `model` (its chunks of the layout), activation
// checkpointing marking every ac_every-th block by its global layer: what the trainer runs and
// what the planner walks (plan/step_work.h).
Program training_program(const StepOptions& step, const ParallelConfig& parallel,
                         const Layout& layout, int rank, const Transformer& model);

// The schedule parallel names for pp ranks and the step's micro-batches (generated, or loaded
// from pp_schedule_csv), and the layers of each of its stages.
Schedule pipeline_schedule(const ParallelConfig& p, int pp, int microbatches);
std::vector<int> stage_layers(const ParallelConfig& p, const Schedule& s, int n_layers);

}  // namespace cleave
