#include "cleave/parallel/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "cleave/base/released_pages.h"
#include "cleave/optim/grad_norm.h"

namespace cleave {

DataParallel::DataParallel(ParamStore& store, DataParallelGroups groups, int zero_stage,
                           double bucket_mb, std::vector<int64_t> unit_bounds, uint64_t seed,
                           const std::string& offload_dir)
    : store_(store), g_(groups), zero_stage_(zero_stage), bounds_(std::move(unit_bounds)) {
  CLEAVE_CHECK(zero_stage >= 0 && zero_stage <= 3, "parallel.zero_stage = " << zero_stage);
  const int64_t shards = g_.shard->size();
  CLEAVE_CHECK(0 <= bounds_.front() && bounds_.back() <= store.total(),
               "units [" << bounds_.front() << ", " << bounds_.back()
                         << ") outside the parameters [0, " << store.total() << ")");
  for (int u = 0; u < n_units(); ++u)
    CLEAVE_CHECK((bounds_[u + 1] - bounds_[u]) % (16 * shards) == 0,
                 "unit " << u << " of " << bounds_[u + 1] - bounds_[u]
                         << " floats is not padded to a multiple of 16 x dp_shard = " << 16 * shards);
  ranges_ = ranges_of(g_.shard->rank());
  if (zero_stage > 0) {
    int64_t at = 0;
    for (int u = 0; u < n_units(); ++u) {
      position_.push_back(at);
      at += slice(u);
    }
    if (zero_stage == 3) {
      if (!offload_dir.empty()) {
        shard_file_ = MappedFloats(offload_dir, at, "params");
        shard_ = shard_file_.data();
      } else {
        shard_values_.resize(at);
        shard_ = shard_values_.data();
      }
      for (int u = 0; u < n_units(); ++u)
        store.init_range(seed, ranges_[u].begin, ranges_[u].end, shard_ + position_[u]);
      drop_offloaded();
    }
    if (zero_stage >= 2) shard_grads_.resize(at);
  }
  grad_work_.resize(n_units());
  replicate_work_.resize(n_units());
  gather_work_.resize(n_units());
  resident_.assign(n_units(), zero_stage < 3);
  gathering_.assign(n_units(), false);
  final_.assign(size_t(n_units()), false);
  // DDP and ZeRO-1 all-reduce buckets, cut from the top of the region: backward fills it from
  // the LM head (highest offsets) down to the embeddings.
  if (zero_stage <= 1 && g_.dp->size() > 1) {
    const int64_t bucket = bucket_floats(bucket_mb);
    for (int64_t end = bounds_.back(); end > bounds_.front(); end -= bucket)
      buckets_.push_back({std::max<int64_t>(bounds_.front(), end - bucket), end, {}, false});
  }
}

int64_t DataParallel::slice(int unit) const {
  return (bounds_[unit + 1] - bounds_[unit]) / g_.shard->size();
}

void DataParallel::reduce_gradients(int unit) {
  if (zero_stage_ >= 2) return unit_gradients_done(unit);
  final_[size_t(unit)] = true;
  launch_ready_buckets();
}

void DataParallel::zero_gradients() {
  // ZeRO-2 and 3 released every unit's gradients after reduce-scattering them: they read as zero.
  if (zero_stage_ < 2)
    std::memset(store_.grads().data() + bounds_.front(), 0,
                size_t(bounds_.back() - bounds_.front()) * sizeof(float));
}

void DataParallel::launch_ready_buckets() {
  for (Bucket& b : buckets_) {
    if (b.launched) continue;
    bool ready = true;
    for (int u = 0; u < n_units() && ready; ++u)
      if (bounds_[u] < b.end && bounds_[u + 1] > b.begin) ready = final_[size_t(u)];
    if (!ready) continue;
    b.work = g_.dp->all_reduce(store_.grads().data() + b.begin, b.end - b.begin, CommType::f32,
                               CommAlgo::ours);
    sent(ring_all_reduce_bytes((b.end - b.begin) * 4, g_.dp->size()));
    b.launched = true;
  }
}

void DataParallel::unit_gradients_done(int unit) {
  grad_work_[unit] = g_.shard->reduce_scatter(store_.grads().data() + bounds_[unit],
                                              shard_grads_.data() + position_[unit], slice(unit),
                                              CommType::f32, CommAlgo::ours);
  sent(ring_gather_bytes(slice(unit) * 4, g_.shard->size()));
  // HSDP: the replicas sum the unit's shard as soon as it is reduced (operations run in issue
  // order), still under the rest of backward.
  if (g_.replicate->size() > 1) {
    replicate_work_[unit] = g_.replicate->all_reduce(shard_grads_.data() + position_[unit],
                                                     slice(unit), CommType::f32, CommAlgo::ours);
    sent(ring_all_reduce_bytes(slice(unit) * 4, g_.replicate->size()));
  }
  // Release the gradients of units whose reduce-scatter has had time to finish, keeping at most
  // two in flight, so the whole gradient is never resident at once.
  grads_pending_.push_back(unit);
  while (grads_pending_.size() > 2) {
    const int u = grads_pending_.front();
    grads_pending_.erase(grads_pending_.begin());
    waited(grad_work_[u].wait());
    release_range(store_.grads().data(), bounds_[u], bounds_[u + 1]);
  }
}

DataParallel::OptimizerInputs DataParallel::finish_gradients() {
  const RangeBuffer values = this->values();
  if (zero_stage_ <= 1) {
    final_.assign(size_t(n_units()), true);  // anything backward did not announce (none, normally)
    launch_ready_buckets();
    final_.assign(size_t(n_units()), false);
    for (Bucket& b : buckets_) {
      waited(b.work.wait());
      b.launched = false;
    }
    return {values, {store_.grads().data(), false}};
  }
  for (int u = 0; u < n_units(); ++u)
    if (grad_work_[u].valid()) waited(grad_work_[u].wait());
  for (int u : grads_pending_) release_range(store_.grads().data(), bounds_[u], bounds_[u + 1]);
  grads_pending_.clear();
  grad_work_.assign(n_units(), Work());
  for (Work& w : replicate_work_)
    if (w.valid()) waited(w.wait());
  replicate_work_.assign(n_units(), Work());
  return {values, {shard_grads_.data(), true}};
}

double DataParallel::grad_sum_of_squares() {
  if (zero_stage_ < 2)
    return sum_of_squares(store_.grads().data() + bounds_.front(), bounds_.back() - bounds_.front());
  // Each rank holds one shard: sum the shards' squares over dp_shard, in the group's fixed order,
  // at the double precision the whole buffer's sum has below ZeRO-2.
  double seconds = 0;
  const double sum = sum_of_doubles(*g_.shard, sum_of_squares(shard_grads_.data(), shard_grads_.size()),
                                    &seconds);
  waited(seconds);
  return sum;
}

void DataParallel::after_optimizer_step() {
  if (zero_stage_ == 1 || zero_stage_ == 2) gather_all_parameters();
}

void DataParallel::gather_fp8(bool current, int margin) {
  CLEAVE_CHECK(zero_stage_ == 3, "FP8 parameter gathers need ZeRO-3, not zero_stage " << zero_stage_);
  fp8_ = std::make_unique<Fp8Allgather>(store_, *g_.shard, bounds_, current, margin);
}

void DataParallel::gather(int unit) {
  if (resident_[unit]) return;
  prefetch(unit);
  if (fp8_ && fp8_->covers(unit)) {
    waited(fp8_->finish(unit));
  } else {
    waited(gather_work_[unit].wait());
    gather_work_[unit] = Work();
  }
  gathering_[unit] = false;
  if (shard_file_.data()) shard_file_.drop(position_[unit], position_[unit] + slice(unit));
  store_.wrote(bounds_[unit], bounds_[unit + 1]);
  resident_[unit] = true;
}

void DataParallel::prefetch(int unit) {
  if (resident_[unit] || gathering_[unit]) return;
  gathering_[unit] = true;
  if (shard_file_.data()) shard_file_.prefetch(position_[unit], position_[unit] + slice(unit));
  if (fp8_ && fp8_->covers(unit)) {
    waited(fp8_->start(unit, shard_source(unit)));
    gather_bytes_ += fp8_->bytes(unit);
    sent(ring_gather_bytes(fp8_->bytes(unit), g_.shard->size()));
    return;
  }
  gather_work_[unit] = g_.shard->all_gather(shard_source(unit), store_.values().data() + bounds_[unit],
                                            slice(unit), CommType::f32, CommAlgo::ours);
  sent(ring_gather_bytes(slice(unit) * 4, g_.shard->size()));
  if (zero_stage_ == 3) gather_bytes_ += 4 * slice(unit);
}

const float* DataParallel::shard_source(int unit) {
  // Below ZeRO-3 the rank's slice sits where all_gather puts it: the gather is in place.
  return zero_stage_ == 3 ? shard_ + position_[unit] : store_.values().data() + ranges_[unit].begin;
}

void DataParallel::release(int unit) {
  if (zero_stage_ < 3 || !resident_[unit]) return;
  release_range(store_.values().data(), bounds_[unit], bounds_[unit + 1]);
  store_.released(bounds_[unit], bounds_[unit + 1]);
  resident_[unit] = false;
}

void DataParallel::gather_all_parameters() {
  if (zero_stage_ == 0) return;
  for (int u = 0; u < n_units(); ++u) {
    resident_[u] = false;  // the values are replaced
    gather(u);
  }
}

RangeBuffer DataParallel::values() {
  return zero_stage_ == 3 ? RangeBuffer{shard_, true} : RangeBuffer{store_.values().data(), false};
}

const MappedFloats* DataParallel::offloaded_values() const {
  return shard_file_.data() ? &shard_file_ : nullptr;
}

void DataParallel::drop_offloaded() { shard_file_.drop(0, shard_file_.size()); }

int DataParallel::checkpoint_files() const { return zero_stage_ == 0 ? 1 : g_.shard->size(); }

int DataParallel::checkpoint_file() const {
  if (zero_stage_ == 0) return g_.dp->rank() == 0 ? 0 : -1;
  return g_.replicate->rank() == 0 ? g_.shard->rank() : -1;
}

std::vector<FlatRange> DataParallel::ranges_of(int shard_rank) const {
  if (zero_stage_ == 0) return {{bounds_.front(), bounds_.back()}};
  std::vector<FlatRange> out;
  for (int u = 0; u < n_units(); ++u) {
    const int64_t begin = bounds_[u] + shard_rank * slice(u);
    out.push_back({begin, begin + slice(u)});
  }
  return out;
}

int64_t bucket_floats(double bucket_mb) {
  return std::max<int64_t>(16, int64_t(bucket_mb * (1 << 20) / 4) / 16 * 16);
}

std::vector<bool> zero3_gather_starts(const Program& program, int n_units) {
  std::vector<bool> starts(program.instructions.size(), false);
  std::vector<bool> resident(size_t(n_units), false), in_flight(size_t(n_units), false);
  for (size_t k = 0; k < program.instructions.size(); ++k) {
    const Instruction& i = program.instructions[k];
    if (i.op != Op::gather && i.op != Op::prefetch && i.op != Op::release) continue;
    const size_t u = size_t(i.unit);
    if (i.op == Op::release) {
      resident[u] = false;
    } else if (!resident[u]) {
      starts[k] = !in_flight[u];
      in_flight[u] = i.op == Op::prefetch;
      resident[u] = i.op == Op::gather;
    }
  }
  return starts;
}

Zero3Peak zero3_peak(const Program& program, const std::vector<int64_t>& per_unit,
                     const std::vector<LinearGemm::WeightCopies>& copies) {
  std::vector<bool> held(per_unit.size(), false);
  std::vector<LinearGemm::WeightCopies> made(per_unit.size());
  int64_t values = 0, copied = 0, values_peak = 0, bytes_peak = 0;
  std::vector<int64_t> packed(program.instructions.size(), 0);
  auto make = [&](size_t u, bool forward) {
    if (copies.empty()) return int64_t(0);
    LinearGemm::WeightCopies& m = made[u];
    const LinearGemm::WeightCopies& c = copies[u];
    const int64_t before = copied;
    copied += c.rounded - m.rounded;
    m.rounded = c.rounded;
    int64_t& kind = forward ? m.forward : m.backward;
    copied += (forward ? c.forward : c.backward) - kind;
    kind = forward ? c.forward : c.backward;
    return copied - before;
  };
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction& i = program.instructions[n];
    const size_t u = size_t(i.unit);
    switch (i.op) {
      case Op::forward:
      case Op::recompute: packed[n] = make(u, true); break;
      case Op::backward:
      case Op::backward_input: packed[n] = make(u, false); break;
      case Op::gather:
      case Op::prefetch:
      case Op::release:
        if (held[u] == (i.op != Op::release)) continue;
        held[u] = i.op != Op::release;
        values += held[u] ? per_unit[u] : -per_unit[u];
        if (!held[u]) {
          copied -= made[u].total();
          made[u] = {};
        }
        break;
      default: continue;
    }
    values_peak = std::max(values_peak, values);
    bytes_peak = std::max(bytes_peak, 4 * values + copied);
  }
  return {values_peak, bytes_peak - 4 * values_peak, std::move(packed)};
}

}  // namespace cleave
