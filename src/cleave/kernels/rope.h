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

// Row r of x (rows rows, row_stride floats apart) is the token at position positions[r]; the
// n_heads heads to rotate start at column 0 of each row. Positions are per row so that documents
// restarting at 0, context-parallel zigzag pieces and serving batches all rotate correctly.
// Applied in place. backward applies the inverse rotation to the gradient, in place.
void rope_forward(float* x, const RopeTable& table, int64_t rows, int n_heads, int64_t row_stride,
                  const int32_t* positions);
void rope_backward(float* dx, const RopeTable& table, int64_t rows, int n_heads,
                   int64_t row_stride, const int32_t* positions);

}  // namespace cleave::kernels
