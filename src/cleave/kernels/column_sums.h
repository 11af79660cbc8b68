// Internal to the kernels: the column sums of an [N, cols] gradient added to a bias gradient, in
// the pass that makes or converts the gradient. Each column is summed over rows 0..N-1 in order in
// double by one thread, blocks of 64 columns shared among threads: the bits do not depend on the
// thread count, and every kernel that sums a bias this way gives the same bits.
#pragma once
#include <algorithm>
#include <cstdint>

namespace cleave::kernels {

constexpr int kColumnSumBlock = 64;

// sum[c] += column c of the values row(n, c0, c1, tile) returns for columns [c0, c1) of row n, in
// order of n: a pointer to them (the matrix's own row, or `tile`, room for kColumnSumBlock values,
// where row makes them), the same width.
template <class Row>
void add_column_sums(float* sum, int64_t N, int cols, Row row) {
  const int nblocks = (cols + kColumnSumBlock - 1) / kColumnSumBlock;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblocks; ++b) {
    const int c0 = b * kColumnSumBlock;
    const int c1 = std::min(cols, c0 + kColumnSumBlock);
    alignas(64) float tile[kColumnSumBlock];
    double acc[kColumnSumBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* v = row(n, c0, c1, tile);
#pragma omp simd
      for (int c = 0; c < c1 - c0; ++c) acc[c] += v[c];
    }
    for (int c = c0; c < c1; ++c) sum[c] = float(double(sum[c]) + acc[c - c0]);
  }
}

}  // namespace cleave::kernels
