// Where one rank's tensor sits in the global tensor of the one model (docs/tensor_parallel.md),
// axis by axis. A parameter is declared with its local shape (what this rank holds) and a
// Placement, which records every mesh axis the tensor is sharded on or its gradient is a pending
// sum over; on every other axis it is replicated. A sharded tensor's local extent along its
// sharded dimension is a list of segments of the global one, which is how fused layouts split:
// tp rank r's [q | k | v] rows are its q heads, then its k heads, then its v heads, three
// segments of the global [q | k | v]. Local rows past the last segment are padding (a vocabulary
// not divisible by tp): they belong to no global element. The data-parallel axes place every
// tensor of a parameter group alike (Replicate, or flat ZeRO shards), so the group's row of the
// axis table says them (parallel/axis_table.h), not each tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

// The mesh axes placements name. A gradient is a pending sum over tp where the tensor's inputs
// were split (norm weights under sequence parallelism), over kv_replicas (the tp ranks sharing one
// kv head, carved out of tp) for a replicated kv head's rows.
inline constexpr char kTpAxis[] = "tp";
inline constexpr char kKvReplicasAxis[] = "kv_replicas";

// Local indices [local, local + length) along the sharded dimension are global [global, ...).
// Segments of one tensor may differ in what their gradient is a pending sum over: the k and v
// rows of a fused [q | k | v] under replicated kv heads, beside q rows that are the rank's own.
struct Segment {
  int64_t local = 0, global = 0, length = 0;
  std::string pending = {};  // the axis its gradient is a pending sum over; empty: none
};

struct Placement {
  std::vector<int64_t> global_shape;  // empty: the local shape (replicated on every axis)
  std::string shard_axis = {};        // the axis the tensor is split over; empty: none
  int shard_dim = -1;                 // the dimension split over shard_axis (0 or 1), or -1
  std::vector<Segment> segments;      // along shard_dim
  std::string pending = {};           // of an unsplit tensor's gradient; empty: none
  // A copy of a tensor another pipeline stage holds (GPT-2's tied embedding beside the LM head
  // on the last stage): the trainer sums its gradient with the owner's over the stages' pair,
  // and only the owner's copy is saved or counted in the gradient norm.
  bool tied_copy = false;
  // Every axis the tensor is sharded on or a pending sum over, each once, in this order.
  std::vector<std::string> axes() const;
};

// Placement helpers for the common cases: rows [begin, begin + length) of a global [rows, ...]
// tensor split over tp; columns likewise. A pending sum of an unsplit tensor over an axis.
Placement shard_rows(std::vector<int64_t> global_shape, std::vector<Segment> segments);
Placement shard_cols(std::vector<int64_t> global_shape, int64_t begin, int64_t length);
Placement pending_sum(const std::string& axis);

// The global element index (row-major) of local element `i` of a tensor of local shape `shape`,
// or -1 for padding.
int64_t global_index(const Placement& p, const std::vector<int64_t>& shape, int64_t i);

// A local tensor (or a flat range of it) as boxes of the global tensor: for each segment, the
// global offset and extent of the box it fills, and the range of the box's row-major elements
// that the local flat range [begin, end) covers (a ZeRO shard may cut a box anywhere).
struct GlobalBox {
  std::vector<int64_t> offset, shape;  // in the global tensor, one per dimension
  int64_t box_begin = 0, box_end = 0;  // elements of the box, row-major
  int64_t local_begin = 0;             // local flat index of the box's element box_begin
  std::string pending;                 // of the segment (or the unsplit tensor) it comes from
};
std::vector<GlobalBox> global_boxes(const Placement& p, const std::vector<int64_t>& shape,
                                    int64_t begin, int64_t end);

// Which copy of a global element counts, where tp ranks hold copies (a gradient norm, a
// checkpoint): never a pipeline stage's tied copy; an unsplit tensor's on tp rank 0, a replicated
// kv head's on the first of its replicas, any other box's on the rank holding it.
struct TpCopy {
  bool first_tp = true, first_kv = true;
  bool owns(const Placement& p, const GlobalBox& b) const {
    if (p.tied_copy) return false;
    if (p.shard_dim < 0) return first_tp;
    return b.pending == kKvReplicasAxis ? first_kv : true;
  }
};

}  // namespace cleave
