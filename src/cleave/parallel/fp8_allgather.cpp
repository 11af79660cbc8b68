#include "cleave/parallel/fp8_allgather.h"

#include <algorithm>

#include "cleave/base/check.h"
#include "cleave/kernels/fp8.h"
#include "cleave/kernels/linear.h"

namespace cleave {

Fp8Allgather::Fp8Allgather(ParamStore& store, Group& shard, std::vector<int64_t> bounds,
                           bool current, int margin)
    : store_(store),
      shard_(shard),
      bounds_(std::move(bounds)),
      current_(current),
      margin_(margin),
      ranks_(shard.size()) {
  const int units = int(bounds_.size()) - 1;
  pieces_.resize(size_t(units));
  for (int t = 0; t < int(store.tensors().size()); ++t) {
    if (!store.fp8_weight(t)) continue;
    const ParamTensor& p = store.tensor(t);
    for (int u = 0; u < units; ++u)
      if (p.offset >= bounds_[size_t(u)] && p.offset < bounds_[size_t(u) + 1])
        pieces_[size_t(u)].push_back({p.offset, p.offset + p.numel, t});
  }
  for (auto& pieces : pieces_)
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  for (int u = 0; u < units; ++u) {
    int64_t most = 0;
    for (int r = 0; r < ranks_; ++r) {
      int64_t others = 0;
      walk(
          u, r, [](size_t, int64_t, int64_t) {}, [&](int64_t b, int64_t e) { others += e - b; });
      most = std::max(most, others);
    }
    max_others_.push_back(most);
  }
}

template <typename Fp8, typename Other>
void Fp8Allgather::walk(int unit, int r, Fp8 fp8, Other other) const {
  const int64_t begin = bounds_[size_t(unit)] + r * slice(unit), end = begin + slice(unit);
  int64_t at = begin;
  const auto& pieces = pieces_[size_t(unit)];
  for (size_t k = 0; k < pieces.size(); ++k) {
    const int64_t b = std::max(pieces[k].begin, begin), e = std::min(pieces[k].end, end);
    if (b >= e) continue;
    if (at < b) other(at, b);
    fp8(k, b, e);
    at = e;
  }
  if (at < end) other(at, end);
}

int64_t Fp8Allgather::bytes(int unit) const { return slice(unit) + 4 * max_others_[size_t(unit)]; }

double Fp8Allgather::start(int unit, const float* mine) {
  double waited = 0;
  auto free =
      std::find_if(flights_.begin(), flights_.end(), [](const InFlight& f) { return f.unit < 0; });
  if (free == flights_.end()) free = flights_.insert(flights_.end(), InFlight());
  InFlight& f = *free;
  f.unit = unit;
  const auto& pieces = pieces_[size_t(unit)];
  const int64_t n = slice(unit), base = bounds_[size_t(unit)] + shard_.rank() * n;
  // The scales: delayed's, set on the products; current's, from each weight's amax over the
  // shards.
  std::vector<float>& scales = f.scales;
  scales.assign(pieces.size(), 1.0f);
  f.shard_amax.assign(pieces.size(), 0.0f);
  walk(
      unit, shard_.rank(),
      [&](size_t k, int64_t b, int64_t e) {
        f.shard_amax[k] = kernels::abs_max(mine + (b - base), e - b);
      },
      [](int64_t, int64_t) {});
  if (current_) {
    const std::vector<float> amax = max_over(shard_, f.shard_amax, &waited);
    for (size_t k = 0; k < pieces.size(); ++k)
      scales[k] = kernels::fp8_scale(amax[k], kernels::Fp8Format::e4m3, margin_, 1.0f);
  } else {
    for (size_t k = 0; k < pieces.size(); ++k)
      scales[k] = store_.packed_by(pieces[k].tensor)->fp8_scales()[fp8_w];
  }
  // Codes where this slice holds FP8 weights (zero elsewhere), fp32 values of the rest.
  f.codes.grow(n);
  f.all_codes.grow(n * ranks_);
  const int64_t m = max_others_[size_t(unit)], room = std::max<int64_t>(m, 1);
  f.others.grow(room);
  f.all_others.grow(room * ranks_);
  std::fill(f.codes.data(), f.codes.data() + n, uint8_t(0));
  int64_t others = 0;
  walk(
      unit, shard_.rank(),
      [&](size_t k, int64_t b, int64_t e) {
        kernels::fp8_quantize(f.codes.data() + (b - base), mine + (b - base), e - b, scales[k],
                              kernels::Fp8Format::e4m3);
      },
      [&](int64_t b, int64_t e) {
        std::copy(mine + (b - base), mine + (e - base), f.others.data() + others);
        others += e - b;
      });
  // Bytes travel as fp32 words: a slice is a multiple of 16 values (DataParallel checks).
  f.codes_work =
      shard_.all_gather(f.codes.data(), f.all_codes.data(), n / 4, CommType::f32, CommAlgo::ours);
  if (m > 0)
    f.others_work =
        shard_.all_gather(f.others.data(), f.all_others.data(), m, CommType::f32, CommAlgo::ours);
  return waited;
}

double Fp8Allgather::finish(int unit) {
  auto it = std::find_if(flights_.begin(), flights_.end(),
                         [&](const InFlight& f) { return f.unit == unit; });
  CLEAVE_CHECK(it != flights_.end(), "Fp8Allgather: unit " << unit << " was not started");
  InFlight& f = *it;
  double waited = f.codes_work.wait();
  if (f.others_work.valid()) waited += f.others_work.wait();
  f.codes_work = f.others_work = Work();
  const int64_t n = slice(unit), m = max_others_[size_t(unit)];
  float* values = store_.values().data();
  for (int r = 0; r < ranks_; ++r) {
    const int64_t base = bounds_[size_t(unit)] + r * n;
    const uint8_t* codes = f.all_codes.data() + r * n;
    const float* others = f.all_others.data() + r * m;
    walk(
        unit, r,
        [&](size_t k, int64_t b, int64_t e) {
          kernels::fp8_dequantize(values + b, codes + (b - base), e - b, 1.0f / f.scales[k],
                                  kernels::Fp8Format::e4m3);
        },
        [&](int64_t b, int64_t e) {
          std::copy(others, others + (e - b), values + b);
          others += e - b;
        });
  }
  const auto& pieces = pieces_[size_t(unit)];
  for (size_t k = 0; k < pieces.size(); ++k)
    store_.packed_by(pieces[k].tensor)->set_fp8_gathered_weight(f.scales[k], f.shard_amax[k]);
  f.unit = -1;
  return waited;
}

}  // namespace cleave
