// Rotary position embedding, rotate-half convention (Hugging Face Llama): within a head of size
// hd, element i < hd/2 pairs with element i + hd/2, rotated by angle pos * theta^(-2i/hd).
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace cleave::kernels {

// The cos and sin of every (position, frequency) pair, computed on first use: a model built only
// to be planned (Transformer::planned) never runs and never pays for them (a 405B Llama's 16
// stages' tables of 8192 x 64 angles were two thirds of its plan's time).
class RopeTable {
 public:
  RopeTable(int head_dim, int64_t max_pos, float theta);
  int head_dim() const { return head_dim_; }
  int64_t max_pos() const { return max_pos_; }
  // Computes the tables if they are not yet; call it before reading rows from several threads.
  void ensure_computed() const;
  // [head_dim / 2] values of position pos (after ensure_computed).
  const float* cos_row(int64_t pos) const { return cos_.data() + pos * (head_dim_ / 2); }
  const float* sin_row(int64_t pos) const { return sin_.data() + pos * (head_dim_ / 2); }

 private:
  int head_dim_;
  int64_t max_pos_;
  float theta_;
  mutable std::once_flag computed_;
  mutable std::vector<float> cos_, sin_;  // [max_pos, head_dim/2]
};

// Row r of x (rows rows, row_stride floats apart) is the token at position positions[r]; the
// n_heads heads to rotate start at column 0 of each row. Positions are per row so that documents
// restarting at 0, context-parallel zigzag pieces and serving batches all rotate correctly.
// Applied in place. backward applies the inverse rotation to the gradient, in place.
void rope_forward(float* x, const RopeTable& table, int64_t rows, int n_heads, int64_t row_stride,
                  const int32_t* positions);
void rope_backward(float* dx, const RopeTable& table, int64_t rows, int n_heads,
                   int64_t row_stride, const int32_t* positions);

}  // namespace cleave::kernels
