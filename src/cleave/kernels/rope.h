// Rotary position embedding, rotate-half convention (Hugging Face Llama): within a head of size
// hd, element i < hd/2 pairs with element i + hd/2, rotated by angle pos * theta^(-2i/hd).
#pragma once
#include <cstdint>
#include <vector>

namespace cleave::kernels {

struct RopeTable {
  int head_dim = 0;
  int64_t max_pos = 0;
  std::vector<float> cos, sin;  // [max_pos, head_dim/2]
  RopeTable(int head_dim, int64_t max_pos, float theta);
};

// x holds B*T rows with `row_stride` floats between consecutive tokens; the n_heads heads to
// rotate start at column 0 of each row. Token t of every sequence has position pos_offset + t.
// Applied in place. backward applies the inverse rotation to the gradient, in place.
void rope_forward(float* x, const RopeTable& table, int64_t B, int64_t T, int n_heads,
                  int64_t row_stride, int64_t pos_offset);
void rope_backward(float* dx, const RopeTable& table, int64_t B, int64_t T, int n_heads,
                   int64_t row_stride, int64_t pos_offset);

}  // namespace cleave::kernels
