#include "cleave/model/params.h"

#include <algorithm>

#include "cleave/base/philox.h"

namespace cleave {

int ParamStore::add(std::string name, std::vector<int64_t> shape, Init init, float init_std,
                    Placement placement, int group) {
  CLEAVE_CHECK(group >= 0 && group < n_groups(), "parameter " << name << ": no group " << group);
  if (n_units_ == 0) n_units_ = 1;
  CLEAVE_CHECK(values_.size() == 0, "parameter " << name << " declared after allocation");
  CLEAVE_CHECK(find(name) < 0, "parameter " << name << " declared twice");
  const int dim = placement.shard_dim;
  CLEAVE_CHECK(dim < int(shape.size()) && (dim != 1 || placement.segments.size() == 1) &&
                   (dim < 0 || placement.global_shape.size() == shape.size()),
               "parameter " << name << ": placement on dimension " << dim << " of a "
                            << shape.size() << "-D tensor");
  for (const Segment& s : placement.segments)
    CLEAVE_CHECK(dim >= 0 && s.local + s.length <= shape[size_t(dim)] &&
                     s.global + s.length <= placement.global_shape[size_t(dim)],
                 "parameter " << name << ": segment [" << s.global << ", +" << s.length
                              << ") outside its local or global extent");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  tensors_.push_back({std::move(name), std::move(shape), std::move(placement), 0, numel, init,
                      init_std, group, n_units_ - 1});
  return int(tensors_.size()) - 1;
}

int ParamStore::add_group(std::string name) {
  CLEAVE_CHECK(values_.size() == 0, "parameter group " << name << " declared after allocation");
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g] == name) return int(g);
  groups_.push_back(std::move(name));
  return int(groups_.size()) - 1;
}

void ParamStore::begin_unit() {
  CLEAVE_CHECK(values_.size() == 0, "unit begun after allocation");
  ++n_units_;
}

void ParamStore::allocate(uint64_t seed, int64_t pad_multiple, ParamValues values) {
  // Group by group, unit by unit, tensors in the order they were added, each at a multiple of
  // 16 floats; each unit padded to a multiple of pad_multiple.
  total_ = 0;
  unit_bounds_.assign(groups_.size(), {});
  for (int g = 0; g < n_groups(); ++g) {
    unit_bounds_[size_t(g)].push_back(total_);
    for (int u = 0; u < n_units_; ++u) {
      for (ParamTensor& t : tensors_) {
        if (t.group != g || t.unit != u) continue;
        t.offset = total_;
        total_ += (t.numel + 15) / 16 * 16;
      }
      total_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
      unit_bounds_[size_t(g)].push_back(total_);
    }
  }
  values_.resize(total_, values == ParamValues::planned);
  grads_.resize(total_, values == ParamValues::planned);
  versions_.assign(tensors_.size(), 1);
  packed_by_.assign(tensors_.size(), nullptr);
  if (values == ParamValues::seeded) init_range(seed, 0, total_, values_.data());
}

void ParamStore::init_range(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  std::fill(out, out + (end - begin), 0.0f);
  for (const ParamTensor& t : tensors_) {
    const int64_t lo = std::max(t.offset, begin), hi = std::min(t.offset + t.numel, end);
    if (lo >= hi) continue;
    float* v = out + (lo - begin);
    const uint64_t stream = hash_name(t.name);
    const int64_t first = lo - t.offset;  // element index within the local tensor
    const bool whole = t.placement.shard_dim < 0;
    // Padding of a sharded tensor (global index -1) stays zero whatever the init.
    switch (t.init) {
      case Init::zeros: break;
      case Init::ones:
        for (int64_t i = 0; i < hi - lo; ++i)
          if (whole || global_index(t.placement, t.shape, first + i) >= 0) v[i] = 1.0f;
        break;
      case Init::normal:
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < hi - lo; ++i) {
          const int64_t g = whole ? first + i : global_index(t.placement, t.shape, first + i);
          if (g >= 0) v[i] = t.init_std * philox_normal(seed, stream, uint64_t(g));
        }
        break;
    }
  }
}

void ParamStore::keep_packed(int tensor, LinearGemm* gemm) {
  CLEAVE_CHECK(!versions_.empty(), "keep_packed before allocate");
  CLEAVE_CHECK(!packed_by_[size_t(tensor)], tensors_[size_t(tensor)].name << " is packed twice");
  packed_by_[size_t(tensor)] = gemm;
  gemm->set_weight(value(tensor), version(tensor));
}

void ParamStore::wrote(int64_t begin, int64_t end) {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].offset < end && tensors_[i].offset + tensors_[i].numel > begin) ++versions_[i];
}

void ParamStore::released(int64_t begin, int64_t end) {
  wrote(begin, end);
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (packed_by_[i] && tensors_[i].offset < end && tensors_[i].offset + tensors_[i].numel > begin)
      packed_by_[i]->release_packed();
}

int64_t ParamStore::begin_band_writes(int tensor) {
  ++versions_[size_t(tensor)];
  LinearGemm* gemm = packed_by_[size_t(tensor)];
  const int64_t rows = gemm ? gemm->begin_row_packing() : 0;
  if (rows > 0) band_writes_.push_back(tensor);
  return rows;
}

void ParamStore::wrote_rows(int tensor, int64_t row0, int64_t row1) {
  packed_by_[size_t(tensor)]->pack_rows(row0, row1);
}

void ParamStore::end_band_writes() {
  for (int t : band_writes_) packed_by_[size_t(t)]->all_rows_packed();
  band_writes_.clear();
}

int ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return int(i);
  return -1;
}

int64_t ParamStore::count() const {
  int64_t n = 0;
  for (auto& t : tensors_) n += t.numel;
  return n;
}

int64_t ParamStore::global_count(int group) const {
  int64_t n = 0;
  for (auto& t : tensors_) {
    if (t.placement.tied_copy || (group >= 0 && t.group != group)) continue;
    int64_t numel = 1;
    for (int64_t d : t.global_shape()) numel *= d;
    n += numel;
  }
  return n;
}

std::vector<TensorPiece> tensor_pieces(const ParamStore& store, const std::vector<FlatRange>& ranges) {
  std::vector<TensorPiece> out;
  int64_t base = 0;  // where the current range starts in a packed buffer
  for (const FlatRange& r : ranges) {
    CLEAVE_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= store.total(),
                 "flat range [" << r.begin << ", " << r.end << ") outside the parameters [0, "
                                << store.total() << ")");
    for (int i = 0; i < int(store.tensors().size()); ++i) {
      const ParamTensor& t = store.tensor(i);
      const int64_t lo = std::max(t.offset, r.begin), hi = std::min(t.offset + t.numel, r.end);
      if (lo < hi) out.push_back({i, lo - t.offset, hi - t.offset, lo, base + (lo - r.begin)});
    }
    base += r.end - r.begin;
  }
  return out;
}

}  // namespace cleave
