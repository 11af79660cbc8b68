// How a training job's ranks divide the work: a pure function of the config and the world size,
// with no MPI, so that every rank checks it before any rank communicates (a bad layout is then one
// error, agreed on and reported once; see cleave/comm/errors.h). The trainer builds its groups
// from it.
#pragma once
#include "cleave/mesh/mesh.h"
#include "cleave/train/config.h"

namespace cleave {

struct Layout {
  Mesh mesh;
  int64_t local_batch;  // samples of each micro-batch on one data-parallel rank
};

// Throws cleave::Error naming the keys and numbers when the config cannot run on `world` ranks:
// a mesh axis this build does not have, degrees that do not make up the world, a micro-batch the
// data-parallel ranks cannot split evenly.
Layout plan_layout(const Config& cfg, int world);

}  // namespace cleave
