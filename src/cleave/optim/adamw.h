// AdamW (Loshchilov & Hutter) with decoupled weight decay, fused in one pass over the flat
// parameter, gradient and moment buffers: gradient clipping's scale is applied in the same pass.
// With cfg.offload = "file" the moments live in memory-mapped files (base/mapped_floats.h): the
// update walks them in spans, reading the next span ahead and dropping each finished one from
// resident memory, bitwise the same update.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/base/mapped_floats.h"
#include "cleave/model/params.h"
#include "cleave/optim/optim_config.h"

namespace cleave {

class AdamW {
 public:
  // State for some ranges of the flat parameters: the whole store, or this rank's shards when the
  // optimizer state is sharded (ZeRO). Its buffers hold the ranges one after the other.
  // last_write: the update is the last write of these values in a step (no data-parallel gather
  // follows it), so the store's packed copies of a linear weight can take it band by band.
  AdamW(ParamStore& store, const OptimConfig& cfg, std::vector<FlatRange> ranges,
        bool last_write = true);

  // One update with learning rate lr of `values` from `grads` (multiplied by grad_scale first).
  // When `values` is the store's own buffer, the update tells the store what it wrote; with
  // last_write, a whole 2-D tensor is written in bands of rows that the store's packed copies
  // take while each band is in cache.
  void step(RangeBuffer values, RangeBuffer grads, double lr, float grad_scale);
  const std::vector<FlatRange>& ranges() const { return ranges_; }
  int64_t size() const { return size_; }

  bool decays(int tensor) const { return decay_[tensor]; }
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // The moments, size() floats each (for checkpoints; offloaded ones are paged in as read).
  float* m() { return m_; }
  float* v() { return v_; }
  // Drops offloaded moments from resident memory after a pass over all of them (a checkpoint).
  void drop_offloaded();
  // The packed values step() updates live in `file` (ZeRO-3's offloaded shard): they are read
  // ahead and dropped span by span with the moments.
  void stream_values(const MappedFloats* file) { values_file_ = file; }

 private:
  ParamStore& store_;
  bool last_write_;
  OptimConfig cfg_;
  std::vector<bool> decay_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<FlatRange> ranges_;
  std::vector<TensorPiece> pieces_;
  int64_t size_ = 0;
  Buffer<float> m_memory_, v_memory_;
  MappedFloats m_file_, v_file_;  // offload = "file"
  const MappedFloats* values_file_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  int64_t t_ = 0;
};

// The decay rule: tensors of two or more dimensions decay unless their name contains one of
// `no_decay`; vectors (norm weights, biases) never decay.
bool weight_decay_applies(const ParamTensor& t, const std::vector<std::string>& no_decay);

}  // namespace cleave
