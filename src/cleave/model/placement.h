// Where one rank's tensor sits in the global tensor of the one model (docs/tensor_parallel.md).
// A parameter is declared with its local shape (what this rank holds) and a Placement: its global
// shape and, on the tp axis, whether it is replicated or sharded along one dimension. A sharded
// tensor's local extent along that dimension is a list of segments of the global one, which is
// how fused layouts split: rank r's [q | k | v] rows are its q heads, then its k heads, then its
// v heads, three segments of the global [q | k | v]. Local rows past the last segment are padding
// (a vocabulary not divisible by tp): they belong to no global element.
// The data-parallel axes place every tensor alike (Replicate, or Flat shards under ZeRO), so
// they are not recorded per tensor; grad_sum names what the gradient is a pending sum over.
#pragma once
#include <cstdint>
#include <vector>

namespace cleave {

// What a tensor's gradient must be summed over, beyond the data-parallel ranks, before the update:
// nothing (replicated inputs give every tp rank the same gradient, sharded tensors own theirs),
// the whole tp group (its inputs were split: norm weights under sequence parallelism), or the tp
// ranks sharing a replicated kv head (grouped-query attention with tp > n_kv_heads).
enum class GradSum { none, tp, kv_replicas };

// Local indices [local, local + length) along the sharded dimension are global [global, ...).
// Segments of one tensor may differ in what their gradient is summed over: the k and v rows of a
// fused [q | k | v] under replicated kv heads, beside q rows that are the rank's own.
struct Segment {
  int64_t local = 0, global = 0, length = 0;
  GradSum grad_sum = GradSum::none;
};

struct Placement {
  std::vector<int64_t> global_shape;  // empty: the local shape (replicated on tp)
  int shard_dim = -1;                 // -1: replicated on tp, else the sharded dimension (0 or 1)
  std::vector<Segment> segments;      // along shard_dim
  GradSum grad_sum = GradSum::none;   // of a replicated tensor
  // A copy of a tensor another pipeline stage holds (GPT-2's tied embedding beside the LM head
  // on the last stage): the trainer sums its gradient with the owner's, and only the owner's
  // copy is saved or counted in the gradient norm.
  bool tied_copy = false;
};

// Placement helpers for the common cases: rows [begin, begin + length) of a global [rows, ...]
// tensor; columns likewise.
Placement shard_rows(std::vector<int64_t> global_shape, std::vector<Segment> segments);
Placement shard_cols(std::vector<int64_t> global_shape, int64_t begin, int64_t length);

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
  GradSum grad_sum = GradSum::none;    // of the segment (or the replicated tensor) it comes from
};
std::vector<GlobalBox> global_boxes(const Placement& p, const std::vector<int64_t>& shape,
                                    int64_t begin, int64_t end);

// Which copy of a global element counts, where tp ranks hold copies (a gradient norm, a
// checkpoint): never a pipeline stage's tied copy; a replicated tensor's on tp rank 0, a replicated kv head's on the first of its
// replicas, any other box's on the rank holding it.
struct TpCopy {
  bool first_tp = true, first_kv = true;
  bool owns(const Placement& p, const GlobalBox& b) const {
    if (p.tied_copy) return false;
    if (p.shard_dim < 0) return first_tp;
    return b.grad_sum == GradSum::kv_replicas ? first_kv : true;
  }
};

}  // namespace cleave
