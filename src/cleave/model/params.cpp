#include "cleave/model/params.h"

#include <algorithm>

#include "cleave/base/philox.h"

namespace cleave {

int ParamStore::add(std::string name, std::vector<int64_t> shape, Init init, float init_std) {
  CLEAVE_CHECK(values_.size() == 0, "parameter " << name << " declared after allocation");
  CLEAVE_CHECK(find(name) < 0, "parameter " << name << " declared twice");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  tensors_.push_back({std::move(name), std::move(shape), total_, numel, init, init_std});
  total_ += (numel + 15) / 16 * 16;
  return int(tensors_.size()) - 1;
}

void ParamStore::allocate(uint64_t seed, int64_t pad_multiple, bool materialise) {
  total_ = (total_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  values_.resize(total_);
  grads_.resize(total_);
  if (materialise) init_range(seed, 0, total_, values_.data());
}

void ParamStore::init_range(uint64_t seed, int64_t begin, int64_t end, float* out) const {
  std::fill(out, out + (end - begin), 0.0f);
  for (const ParamTensor& t : tensors_) {
    const int64_t lo = std::max(t.offset, begin), hi = std::min(t.offset + t.numel, end);
    if (lo >= hi) continue;
    float* v = out + (lo - begin);
    const uint64_t stream = hash_name(t.name);
    const int64_t first = lo - t.offset;  // element index within the tensor
    switch (t.init) {
      case Init::zeros: break;
      case Init::ones: std::fill(v, v + (hi - lo), 1.0f); break;
      case Init::normal:
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < hi - lo; ++i) v[i] = t.init_std * philox_normal(seed, stream, first + i);
        break;
    }
  }
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
