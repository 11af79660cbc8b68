#include "cleave/model/placement.h"

#include <algorithm>

#include "cleave/base/check.h"

namespace cleave {

Placement shard_rows(std::vector<int64_t> global_shape, std::vector<Segment> segments) {
  Placement p;
  p.global_shape = std::move(global_shape);
  p.shard_axis = kTpAxis;
  p.shard_dim = 0;
  p.segments = std::move(segments);
  return p;
}

Placement shard_cols(std::vector<int64_t> global_shape, int64_t begin, int64_t length) {
  Placement p;
  p.global_shape = std::move(global_shape);
  p.shard_axis = kTpAxis;
  p.shard_dim = 1;
  p.segments = {{0, begin, length, ""}};
  return p;
}

Placement pending_sum(const std::string& axis) {
  Placement p;
  p.pending = axis;
  return p;
}

std::vector<std::string> Placement::axes() const {
  std::vector<std::string> out;
  auto add = [&](const std::string& axis) {
    if (!axis.empty() && std::find(out.begin(), out.end(), axis) == out.end()) out.push_back(axis);
  };
  add(shard_axis);
  add(pending);
  for (const Segment& s : segments) add(s.pending);
  return out;
}

namespace {

// Elements per step along dimension 0 (a row), locally and globally.
int64_t row_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

}  // namespace

int64_t global_index(const Placement& p, const std::vector<int64_t>& shape, int64_t i) {
  if (p.shard_dim < 0) return i;
  const int64_t cols = row_size(shape);
  const int64_t r = i / cols, c = i % cols;
  if (p.shard_dim == 0) {
    for (const Segment& s : p.segments)
      if (r >= s.local && r < s.local + s.length) return (s.global + r - s.local) * cols + c;
    return -1;
  }
  const Segment& s = p.segments.front();  // one segment of columns (checked by ParamStore::add)
  return r * p.global_shape[1] + s.global + c;
}

std::vector<GlobalBox> global_boxes(const Placement& p, const std::vector<int64_t>& shape,
                                    int64_t begin, int64_t end) {
  std::vector<GlobalBox> out;
  const std::vector<int64_t> zeros(shape.size(), 0);
  if (p.shard_dim < 0) {
    if (begin < end) out.push_back({zeros, shape, begin, end, begin, p.pending});
    return out;
  }
  const int64_t cols = row_size(shape);
  if (p.shard_dim == 1) {
    const Segment& s = p.segments.front();
    std::vector<int64_t> offset = zeros;
    offset[1] = s.global;
    if (begin < end) out.push_back({offset, shape, begin, end, begin, s.pending});
    return out;
  }
  for (const Segment& s : p.segments) {
    const int64_t lo = std::max(begin, s.local * cols);
    const int64_t hi = std::min(end, (s.local + s.length) * cols);
    if (lo >= hi) continue;
    GlobalBox b{zeros, shape, lo - s.local * cols, hi - s.local * cols, lo, s.pending};
    b.offset[0] = s.global;
    b.shape[0] = s.length;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace cleave
