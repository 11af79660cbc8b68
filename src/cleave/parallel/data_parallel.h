// The data-parallel family over the flat gradient and parameter buffers (DESIGN.md section 7).
// Ranks of dp_replicate hold replicas; ranks of dp_shard shard what zero_stage says:
//   0  DDP: gradients all-reduced in buckets, each started as soon as backward has finished the
//      gradients it holds, overlapping the rest of backward; every rank updates everything.
//   1  ZeRO-1: the same all-reduce; each rank updates only its shard of the parameters (its
//      optimizer state is only that shard); the updated parameters are all-gathered.
//   2  ZeRO-2: gradients reduce-scattered over dp_shard (then all-reduced over dp_replicate), so
//      each rank receives only its shard's gradients; update and all-gather as ZeRO-1.
// Shards are equal: the parameter buffer is padded to a multiple of dp_shard x 16.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cleave/base/buffer.h"
#include "cleave/comm/group.h"
#include "cleave/model/params.h"

namespace cleave {

struct DataParallelGroups {
  Group* dp = nullptr;         // every data-parallel rank (dp_replicate x dp_shard)
  Group* shard = nullptr;      // this rank's dp_shard group
  Group* replicate = nullptr;  // this rank's dp_replicate group
};

class DataParallel {
 public:
  DataParallel(ParamStore& store, DataParallelGroups groups, int zero_stage, double bucket_mb);

  // Flat range of the parameters this rank updates (all of them below ZeRO-1).
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }

  // During backward of the last micro-batch of a step: gradients at offsets >= offset are final.
  void grads_ready(int64_t offset);
  // After backward: completes the gradient synchronisation. Returns this rank's synchronised
  // gradients for [shard_begin, shard_end).
  const float* finish_gradients();
  // Sum of squares of the whole synchronised gradient (identical on every rank).
  double grad_sum_of_squares();
  // After the optimizer updated [shard_begin, shard_end): every rank gets all parameters.
  void gather_parameters();

  // Seconds this rank waited on collectives since the last call (exposed communication).
  double take_exposed_seconds();

 private:
  struct Bucket {
    int64_t begin, end;  // flat range; buckets are cut from the top down (backward order)
    Work work;
    bool launched = false;
  };

  ParamStore& store_;
  DataParallelGroups g_;
  int zero_stage_;
  int64_t begin_ = 0, end_ = 0;
  std::vector<Bucket> buckets_;
  Buffer<float> shard_grads_;  // ZeRO-2: this rank's reduced gradient shard
  double exposed_ = 0;
};

}  // namespace cleave
