// All parameters a rank holds live in one flat fp32 buffer, their gradients in a second one of the
// same layout (llm.c's choice; data-parallel buckets and ZeRO shards are slices of these).
// Each tensor is this rank's part of a global tensor (model/placement.h) and is initialised by
// Philox keyed by (seed, name, global element index), so the values do not depend on which
// tensors exist beside it, on the order of construction or on the layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/kernels/linear.h"
#include "cleave/model/placement.h"

namespace cleave {

enum class Init { normal, zeros, ones };

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;  // local: what this rank holds
  Placement placement;         // its global shape and where the local tensor sits in it
  int64_t offset = 0;  // into the flat buffers, a multiple of 16 floats (set by allocate())
  int64_t numel = 0;
  Init init = Init::normal;
  float init_std = 0.0f;
  int group = 0;  // its parameter group (ParamStore::add_group)
  int unit = 0;   // its unit (ParamStore::begin_unit)
  const std::vector<int64_t>& global_shape() const {
    return placement.global_shape.empty() ? shape : placement.global_shape;
  }
};

// A slice [begin, end) of the flat buffers: a data-parallel shard is a list of them.
struct FlatRange {
  int64_t begin = 0, end = 0;
};

// Values (or gradients, or optimizer moments) of a list of flat ranges: in a whole flat buffer
// (range [begin, end) at data + begin), or packed (the ranges one after the other).
struct RangeBuffer {
  float* data = nullptr;
  bool packed = false;
};

// The part of one tensor inside a list of flat ranges: its elements [begin, end), which sit at
// `flat` in the flat buffers and at `packed` in a packed buffer of the ranges.
struct TensorPiece {
  int tensor = 0;
  int64_t begin = 0, end = 0;
  int64_t flat = 0, packed = 0;
  float* in(RangeBuffer b) const { return b.data + (b.packed ? packed : flat); }
};

// What a model's parameter values are at its construction.
enum class ParamValues {
  seeded,  // every value initialised from the seed
  unset,   // memory, left for the caller (ZeRO-3 initialises only its shards, with init_range)
  planned, // address space only, never touched: a model built to be planned (Transformer::planned)
};

class ParamStore;
// Every tensor's part of each range, range by range; padding between tensors belongs to none.
std::vector<TensorPiece> tensor_pieces(const ParamStore& store, const std::vector<FlatRange>& ranges);

// Parameters are grouped twice (docs/architecture.md, Parameter groups):
// - groups: tensors whose gradients are reduced and sharded over the same mesh axes. The model
//   names them ("dense" for every tensor today; experts will be another), the trainer maps each
//   name to its axes, and data parallelism and the optimizer run once per group. Each group
//   lives in its own contiguous region of the flat buffers.
// - units: tensors used together in the forward order (the embeddings, each block, the head),
//   which ZeRO gathers and releases together. Within its group's region each unit is contiguous
//   and padded to the allocation's pad_multiple, so each splits into equal shards.
class ParamStore {
 public:
  ParamStore() : groups_{"dense"} {}
  // Declares a tensor of local shape `shape` in the current unit; returns its index. Only
  // before allocate().
  int add(std::string name, std::vector<int64_t> shape, Init init, float init_std = 0.0f,
          Placement placement = {}, int group = 0);
  int add_group(std::string name);  // returns its index; 0 is "dense"
  void begin_unit();                // the tensors added next form a new unit
  // Lays out the groups and units, allocates values and gradients and, as `values` says,
  // initialises every value from the seed.
  void allocate(uint64_t seed, int64_t pad_multiple = 1, ParamValues values = ParamValues::seeded);
  int n_groups() const { return int(groups_.size()); }
  const std::string& group_name(int g) const { return groups_[size_t(g)]; }
  int n_units() const { return n_units_; }
  // Group g's region of the flat buffers by unit: unit u is [bounds[u], bounds[u + 1]).
  const std::vector<int64_t>& unit_bounds(int g) const { return unit_bounds_[size_t(g)]; }
  // The initial values of the flat range [begin, end) into out (padding gets zeros).
  void init_range(uint64_t seed, int64_t begin, int64_t end, float* out) const;

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(int i) const { return tensors_[i]; }
  int find(const std::string& name) const;  // -1 when absent
  float* value(int i) { return values_.data() + tensors_[i].offset; }
  float* grad(int i) { return grads_.data() + tensors_[i].offset; }
  Buffer<float>& values() { return values_; }
  Buffer<float>& grads() { return grads_; }
  int64_t total() const { return total_; }  // flat size, padding included
  int64_t count() const;                    // parameters, padding excluded
  int64_t global_count(int group = -1) const;  // of the one model this rank holds a share
                                               // of (of one group), tied copies left out

  // Every writer of the values says what it wrote, here, and nowhere else: the optimizer, a
  // data-parallel gather or release, a checkpoint load (docs/architecture.md, Weight versions).
  // Each tensor has a version, bumped by each write; a product that keeps a packed copy of a
  // weight (keep_packed) compares its copy's version with it before use and repacks when they
  // differ. released() also frees those copies at once: under ZeRO-3 a unit's weights exist only
  // while it runs.
  void keep_packed(int tensor, LinearGemm* gemm);  // after allocate(); binds the gemm's weight
  LinearGemm* packed_by(int tensor) const { return packed_by_[size_t(tensor)]; }  // or null
  // Whether tensor is the weight of an FP8 product (the linears fp8 mode quantises).
  bool fp8_weight(int tensor) const {
    const LinearGemm* g = packed_by(tensor);
    return g && g->precision() == Precision::fp8;
  }
  const uint64_t* version(int tensor) const { return &versions_[size_t(tensor)]; }
  void wrote(int64_t begin, int64_t end);  // the flat range [begin, end) of the values
  void wrote_all() { wrote(0, total_); }
  void released(int64_t begin, int64_t end);
  // Packing while writing, for a writer of whole 2-D tensors that can update one in bands of
  // rows while each band is in cache (AdamW): the rows per band for tensor t (0: write it any
  // way, its copies are packed at their next use), then wrote_rows for each band once written
  // (bands may be written in parallel), then end_band_writes once every band begun is.
  int64_t begin_band_writes(int tensor);
  void wrote_rows(int tensor, int64_t row0, int64_t row1);
  void end_band_writes();

 private:
  std::vector<ParamTensor> tensors_;
  std::vector<std::string> groups_;
  int n_units_ = 0;
  std::vector<std::vector<int64_t>> unit_bounds_;  // per group, from allocate()
  int64_t total_ = 0;
  Buffer<float> values_, grads_;
  std::vector<uint64_t> versions_;           // one per tensor, from allocate()
  std::vector<LinearGemm*> packed_by_;       // per tensor: the product packing it, or null
  std::vector<int> band_writes_;             // tensors begun since the last end_band_writes
};

}  // namespace cleave
