#include "cleave/parallel/data_parallel.h"

#include <algorithm>

#include "cleave/optim/grad_norm.h"

namespace cleave {

DataParallel::DataParallel(ParamStore& store, DataParallelGroups groups, int zero_stage,
                           double bucket_mb)
    : store_(store), g_(groups), zero_stage_(zero_stage) {
  CLEAVE_CHECK(zero_stage >= 0 && zero_stage <= 2,
               "parallel.zero_stage = " << zero_stage << " is not built yet (0, 1 and 2 are)");
  const int64_t total = store.total();
  const int shards = g_.shard->size();
  CLEAVE_CHECK(total % shards == 0, "parameter buffer of " << total
                                                           << " floats is not padded to a multiple of dp_shard = "
                                                           << shards);
  if (zero_stage >= 1) {
    const int64_t shard = total / shards;
    begin_ = int64_t(g_.shard->rank()) * shard;
    end_ = begin_ + shard;
  } else {
    begin_ = 0, end_ = total;
  }
  if (zero_stage == 2) shard_grads_.resize(end_ - begin_);
  // DDP and ZeRO-1 all-reduce buckets, cut from the top of the buffer: backward fills it from the
  // LM head (highest offsets) down to the embeddings.
  if (zero_stage <= 1 && g_.dp->size() > 1) {
    const int64_t bucket = std::max<int64_t>(16, int64_t(bucket_mb * (1 << 20) / 4) / 16 * 16);
    for (int64_t end = total; end > 0; end -= bucket)
      buckets_.push_back({std::max<int64_t>(0, end - bucket), end, {}, false});
  }
}

void DataParallel::grads_ready(int64_t offset) {
  for (Bucket& b : buckets_) {
    if (b.launched || b.begin < offset) continue;
    b.work = g_.dp->all_reduce(store_.grads().data() + b.begin, b.end - b.begin, CommType::f32,
                               CommAlgo::ours);
    b.launched = true;
  }
}

const float* DataParallel::finish_gradients() {
  if (zero_stage_ == 2) {
    exposed_ += g_.shard->reduce_scatter(store_.grads().data(), shard_grads_.data(),
                                         end_ - begin_, CommType::f32, CommAlgo::ours)
                    .wait();
    if (g_.replicate->size() > 1)
      exposed_ += g_.replicate->all_reduce(shard_grads_.data(), end_ - begin_, CommType::f32,
                                           CommAlgo::ours)
                      .wait();
    return shard_grads_.data();
  }
  grads_ready(0);  // anything backward did not announce (none, normally)
  for (Bucket& b : buckets_) {
    exposed_ += b.work.wait();
    b.launched = false;
  }
  return store_.grads().data() + begin_;
}

double DataParallel::grad_sum_of_squares() {
  if (zero_stage_ < 2) return sum_of_squares(store_.grads().data(), store_.total());
  // Each rank holds one shard: sum the shards' squares over dp_shard. fp32 partial sums are
  // enough for a norm that only scales clipping; the order of the sum is fixed by the group.
  float partial = float(sum_of_squares(shard_grads_.data(), end_ - begin_));
  exposed_ += g_.shard->all_reduce(&partial, 1, CommType::f32, CommAlgo::ours).wait();
  return partial;
}

void DataParallel::gather_parameters() {
  if (zero_stage_ == 0 || g_.shard->size() == 1) return;
  float* values = store_.values().data();
  exposed_ += g_.shard->all_gather(values + begin_, values, end_ - begin_, CommType::f32,
                                   CommAlgo::ours)
                  .wait();
}

double DataParallel::take_exposed_seconds() {
  const double e = exposed_;
  exposed_ = 0;
  return e;
}

}  // namespace cleave
