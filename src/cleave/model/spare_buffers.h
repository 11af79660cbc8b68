// The spares a model's blocks share (base/spare_buffers.h): activation checkpointing takes a
// block's saved buffers after its forward (full: all it saved; selective: the cheap part) and
// hands them to the next block's forward or recompute.
#pragma once
#include "cleave/base/bf16.h"
#include "cleave/base/spare_buffers.h"

namespace cleave {

// A model's spares: activations, and the bf16 copies of them its products keep.
struct RecomputeSpares {
  SpareBuffers<float> floats;
  SpareBuffers<bf16> copies;
};

}  // namespace cleave
