#include "cleave/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace cleave {

// Elements per task of the plain update.
constexpr int64_t kBlock = 1 << 14;
// Offloaded moments: elements per span read ahead and dropped after (4 MiB of each moment).
constexpr int64_t kSpan = 1 << 20;

bool weight_decay_applies(const ParamTensor& t, const std::vector<std::string>& no_decay) {
  if (t.shape.size() < 2) return false;
  for (auto& pattern : no_decay)
    if (t.name.find(pattern) != std::string::npos) return false;
  return true;
}

AdamW::AdamW(ParamStore& store, const OptimConfig& cfg, std::vector<FlatRange> ranges,
             bool last_write)
    : store_(store), last_write_(last_write), cfg_(cfg), ranges_(std::move(ranges)) {
  pieces_ = tensor_pieces(store, ranges_);  // checks the ranges
  int64_t size = 0;
  for (const FlatRange& r : ranges_) size += r.end - r.begin;
  for (auto& t : store.tensors()) {
    decay_.push_back(weight_decay_applies(t, cfg.no_decay));
    shapes_.push_back(t.shape);
  }
  // A pattern that matches no tensor would be ignored without a word: a name from another
  // naming (e.g. Hugging Face's c_attn) or a typo.
  const std::vector<ParamTensor>& tensors = store.tensors();
  for (const std::string& pattern : cfg.no_decay) {
    if (pattern.empty()) throw Error("optim.no_decay: \"\" would match every parameter");
    if (std::none_of(tensors.begin(), tensors.end(), [&](const ParamTensor& t) {
          return t.name.find(pattern) != std::string::npos;
        }))
      throw Error("optim.no_decay: \"" + pattern +
                  "\" matches no parameter of this model (first: " +
                  tensors.front().name + ", last: " + tensors.back().name +
                  "; docs/config.md lists them)");
  }
  size_ = size;
  if (cfg.offload == "file") {
    m_file_ = MappedFloats(cfg.offload_dir, size, "adam_m");
    v_file_ = MappedFloats(cfg.offload_dir, size, "adam_v");
    m_ = m_file_.data();
    v_ = v_file_.data();
  } else {
    CLEAVE_CHECK(cfg.offload == "none", "AdamW: offload \"" << cfg.offload << "\"");
    m_memory_.resize(size);
    v_memory_.resize(size);
    m_ = m_memory_.data();
    v_ = v_memory_.data();
  }
}

void AdamW::drop_offloaded() {
  m_file_.drop(0, m_file_.size());
  v_file_.drop(0, v_file_.size());
}

namespace {

struct Coefficients {
  float b1, b2, eps, step_size, inv_sqrt_bc2, decay, grad_scale;
};

// Elements [j0, j1) of one piece. Every multiply-add is an explicit fma, so the vectorised body
// and the scalar remainder round alike wherever a piece or chunk starts (the compiler may not
// contract a product into an fma call): the result does not depend on how ranges are cut.
inline void update(float* p, const float* g, float* m, float* v, int64_t j0, int64_t j1,
                   const Coefficients& c) {
#pragma omp simd
  for (int64_t j = j0; j < j1; ++j) {
    const float gj = g[j] * c.grad_scale;
    const float mj = std::fma(c.b1, m[j], (1.0f - c.b1) * gj);
    const float vj = std::fma(c.b2, v[j], ((1.0f - c.b2) * gj) * gj);
    m[j] = mj;
    v[j] = vj;
    const float step = c.step_size * mj / std::fma(std::sqrt(vj), c.inv_sqrt_bc2, c.eps);
    p[j] = std::fma(p[j], c.decay, -step);
  }
}

}  // namespace

void AdamW::step(RangeBuffer values, RangeBuffer grads, double lr, float grad_scale) {
  const bool in_store = !values.packed && values.data == store_.values().data();
  ++t_;
  Coefficients c;
  c.b1 = float(cfg_.beta1);
  c.b2 = float(cfg_.beta2);
  c.eps = float(cfg_.eps);
  c.step_size = float(lr) / float(1.0 - std::pow(cfg_.beta1, double(t_)));
  c.inv_sqrt_bc2 = 1.0f / std::sqrt(float(1.0 - std::pow(cfg_.beta2, double(t_))));
  c.grad_scale = grad_scale;
  // Offloaded moments (and values), in packed offsets: once [0, end) is updated, up to kSpan past
  // `end` is read ahead, and what was finished is dropped from resident memory a kSpan at a time
  // (the pieces come in packed order).
  std::vector<const MappedFloats*> files;
  if (m_file_.data()) files = {&m_file_, &v_file_};
  if (values_file_ && values.packed) files.push_back(values_file_);
  const bool offloaded = !files.empty();
  int64_t fetched = 0, dropped = 0;
  auto reached = [&](int64_t end) {
    if (!offloaded) return;
    while (fetched < std::min(size_, end + kSpan)) {
      const int64_t next = std::min(size_, fetched + kSpan);
      for (const MappedFloats* f : files) f->prefetch(fetched, next);
      fetched = next;
    }
    if (end - dropped >= kSpan) {
      for (const MappedFloats* f : files) f->drop(dropped, end);
      dropped = end;
    }
  };
  reached(0);
  for (const TensorPiece& piece : pieces_) {
    float* p = piece.in(values);
    const float* g = piece.in(grads);
    float* m = m_ + piece.packed;
    float* v = v_ + piece.packed;
    c.decay = decay_[piece.tensor] ? 1.0f - float(lr * cfg_.weight_decay) : 1.0f;
    const std::vector<int64_t>& shape = shapes_[size_t(piece.tensor)];
    const int64_t n = piece.end - piece.begin;
    const bool whole = shape.size() == 2 && piece.begin == 0 && n == shape[0] * shape[1];
    const int64_t rows = in_store && last_write_ && whole ? store_.begin_band_writes(piece.tensor) : 0;
    // Spans of whole bands (or blocks) of at most kSpan elements when offloaded, else the piece:
    // the update is elementwise, so any cut gives the same bits.
    const int64_t unit = rows > 0 ? rows * shape[1] : kBlock;
    const int64_t span = offloaded ? std::max<int64_t>(1, kSpan / unit) * unit : n;
    if (rows <= 0 && in_store) store_.wrote(piece.flat, piece.flat + n);
    for (int64_t s0 = 0; s0 < n; s0 += span) {
      const int64_t s1 = std::min(n, s0 + span);
      if (rows <= 0) {
        const int64_t nblocks = (s1 - s0 + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nblocks; ++b)
          update(p, g, m, v, s0 + b * kBlock, std::min(s1, s0 + (b + 1) * kBlock), c);
      } else {
        const int64_t cols = shape[1], r_begin = s0 / cols, r_end = s1 / cols;
        const int64_t nchunks = (r_end - r_begin + rows - 1) / rows;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < nchunks; ++k) {
          const int64_t r0 = r_begin + k * rows, r1 = std::min(r_end, r0 + rows);
          update(p, g, m, v, r0 * cols, r1 * cols, c);
          store_.wrote_rows(piece.tensor, r0, r1);
        }
      }
      reached(piece.packed + s1);
    }
  }
  for (const MappedFloats* f : files) f->drop(dropped, size_);
  store_.end_band_writes();
}

}  // namespace cleave
