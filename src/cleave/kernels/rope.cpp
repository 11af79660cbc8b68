// Rotary position embedding, rotate-half convention (Hugging Face Llama).
//
// For a head of size hd = 2h and i < h, the pair (x[i], x[i + h]) is rotated by the angle
// a = pos * theta^(-2i/hd):
//   forward:  y[i] = x[i] cos a - x[i+h] sin a,   y[i+h] = x[i+h] cos a + x[i] sin a
//   backward: the transpose (= inverse) rotation, by -a.
// Tokens are independent, so rows are split among threads; each row is computed the same way
// whatever the thread count.
#include "cleave/kernels/rope.h"

#include <cmath>

#include "cleave/base/check.h"

namespace cleave::kernels {

RopeTable::RopeTable(int head_dim, int64_t max_pos, float theta)
    : head_dim_(head_dim), max_pos_(max_pos), theta_(theta) {
  CLEAVE_CHECK(head_dim > 0 && head_dim % 2 == 0,
               "rope head_dim=" << head_dim << " must be positive and even");
  CLEAVE_CHECK(max_pos >= 0, "rope max_pos=" << max_pos << " must be >= 0");
  CLEAVE_CHECK(theta > 0.0f, "rope theta=" << theta << " must be > 0");
}

void RopeTable::ensure_computed() const {
  std::call_once(computed_, [this] {
    const int half = head_dim_ / 2;
    cos_.resize(static_cast<size_t>(max_pos_) * half);
    sin_.resize(static_cast<size_t>(max_pos_) * half);
    // Angles in double: pos * freq reaches ~1e5 rad at long contexts, where a float product would
    // already be off by ~1e-2 rad before the cos/sin.
    std::vector<double> inv_freq(half);
    for (int i = 0; i < half; i++)
      inv_freq[i] = std::pow(double(theta_), -2.0 * i / double(head_dim_));
    for (int64_t p = 0; p < max_pos_; p++) {
      for (int i = 0; i < half; i++) {
        const double a = static_cast<double>(p) * inv_freq[i];
        cos_[p * half + i] = static_cast<float>(std::cos(a));
        sin_[p * half + i] = static_cast<float>(std::sin(a));
      }
    }
  });
}

namespace {

// Validated before the parallel region: an exception must not escape OpenMP.
void check_args(const RopeTable& table, int64_t rows, int n_heads, int64_t row_stride,
                const int32_t* positions) {
  // The table's head_dim is positive and even: its constructor checks it.
  CLEAVE_CHECK(rows >= 0, "rope rows=" << rows << " must be >= 0");
  CLEAVE_CHECK(n_heads > 0, "rope n_heads=" << n_heads << " must be > 0");
  CLEAVE_CHECK(row_stride >= static_cast<int64_t>(n_heads) * table.head_dim(),
               "rope row_stride=" << row_stride << " < n_heads*head_dim="
                                  << static_cast<int64_t>(n_heads) * table.head_dim());
  CLEAVE_CHECK(positions != nullptr || rows == 0,
               "rope positions are null for " << rows << " rows");
  for (int64_t r = 0; r < rows; r++)
    CLEAVE_CHECK(positions[r] >= 0 && positions[r] < table.max_pos(),
                 "rope row " << r << " has position " << positions[r]
                             << ", outside the table's [0, " << table.max_pos() << ")");
}

// sign = +1 rotates by +a (forward), -1 by -a (backward).
void rope_apply(float* x, const RopeTable& table, int64_t rows, int n_heads, int64_t row_stride,
                const int32_t* positions, float sign) {
  check_args(table, rows, n_heads, row_stride, positions);
  table.ensure_computed();
  const int hd = table.head_dim();
  const int half = hd / 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t pos = positions[r];
    const float* c = table.cos_row(pos);
    const float* s = table.sin_row(pos);
    for (int h = 0; h < n_heads; h++) {
      float* x1 = x + r * row_stride + static_cast<int64_t>(h) * hd;
      float* x2 = x1 + half;
      for (int i = 0; i < half; i++) {
        const float a = x1[i], b = x2[i], si = sign * s[i];
        x1[i] = a * c[i] - b * si;
        x2[i] = b * c[i] + a * si;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const RopeTable& table, int64_t rows, int n_heads, int64_t row_stride,
                  const int32_t* positions) {
  rope_apply(x, table, rows, n_heads, row_stride, positions, 1.0f);
}

void rope_backward(float* dx, const RopeTable& table, int64_t rows, int n_heads,
                   int64_t row_stride, const int32_t* positions) {
  rope_apply(dx, table, rows, n_heads, row_stride, positions, -1.0f);
}

}  // namespace cleave::kernels
