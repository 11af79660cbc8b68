// Token and learned-position embeddings.
//
// Forward: rows are independent. Backward scatters into the embedding tables; several rows may
// hit the same table row (repeated tokens, repeated positions), so instead of atomics each thread
// owns a block of kColBlock channels of one table and walks all rows in order: every element is
// summed in row order, whatever the thread count. That order also makes a batch whose positions
// are pos_offset + t sum dwpe over b exactly as a per-position loop would.
#include "cleave/kernels/embedding.h"

#include <algorithm>
#include <optional>

#include "cleave/base/check.h"

namespace cleave::kernels {
namespace {

constexpr int kColBlock = 64;  // channels per task in a scatter: 256 bytes per row touched

void check_shape(int64_t N, int C) {
  CLEAVE_CHECK(N >= 0, "embedding N=" << N << " must be >= 0");
  CLEAVE_CHECK(C > 0, "embedding C=" << C << " must be > 0");
}

// Validated before any parallel region: an exception must not escape OpenMP. The vocabulary
// size is not part of the interface, so only negative ids can be caught here.
void check_tokens(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    CLEAVE_CHECK(tokens[i] >= 0, "embedding token " << i << " has negative id " << tokens[i]);
}

// max_pos: the table's rows when the interface gives them; otherwise only negative positions
// can be caught here.
void check_positions(const int32_t* positions, int64_t n, std::optional<int64_t> max_pos) {
  CLEAVE_CHECK(positions != nullptr || n == 0, "embedding positions are null for " << n << " rows");
  for (int64_t i = 0; i < n; i++) {
    CLEAVE_CHECK(positions[i] >= 0,
                 "embedding row " << i << " has negative position " << positions[i]);
    if (max_pos)
      CLEAVE_CHECK(positions[i] < *max_pos, "embedding row " << i << " has position "
                                                << positions[i] << " >= wpe's max_pos="
                                                << *max_pos);
  }
}

int col_blocks(int C) { return (C + kColBlock - 1) / kColBlock; }

// table[rows[r]] += dout[r] on channels [c0, c1), rows in order.
void scatter_block(float* table, const float* dout, const int32_t* rows, int64_t n, int C, int c0,
                   int c1) {
  for (int64_t r = 0; r < n; r++) {
    float* w = table + static_cast<int64_t>(rows[r]) * C;
    const float* g = dout + r * C;
    for (int c = c0; c < c1; c++) w[c] += g[c];
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       const int32_t* positions, int64_t N, int C, int64_t max_pos) {
  check_shape(N, C);
  check_tokens(tokens, N);
  if (wpe) {
    CLEAVE_CHECK(max_pos >= 0, "embedding max_pos=" << max_pos << " must be >= 0");
    check_positions(positions, N, max_pos);
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; r++) {
    float* o = out + r * C;
    const float* e = wte + static_cast<int64_t>(tokens[r]) * C;
    if (wpe) {
      const float* p = wpe + static_cast<int64_t>(positions[r]) * C;
      for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    } else {
      for (int c = 0; c < C; c++) o[c] = e[c];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        const int32_t* positions, int64_t N, int C) {
  check_shape(N, C);
  check_tokens(tokens, N);
  if (dwpe) check_positions(positions, N, std::nullopt);
  // dwte's and dwpe's blocks are separate tasks: with few channel blocks, the second table keeps
  // threads busy that the first alone would leave idle.
  const int nblocks = col_blocks(C);
  const int ntasks = dwpe ? 2 * nblocks : nblocks;
#pragma omp parallel for schedule(static)
  for (int task = 0; task < ntasks; task++) {
    const bool pe = task >= nblocks;
    const int c0 = (pe ? task - nblocks : task) * kColBlock, c1 = std::min(C, c0 + kColBlock);
    scatter_block(pe ? dwpe : dwte, dout, pe ? positions : tokens, N, C, c0, c1);
  }
}

}  // namespace cleave::kernels

namespace cleave::kernels {

void embedding_lookup_shard(float* out, const int32_t* tokens, const float* wte, int64_t N, int C,
                            int64_t vocab_begin, int64_t rows) {
  check_shape(N, C);
  check_tokens(tokens, N);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; r++) {
    float* o = out + r * C;
    const int64_t row = int64_t(tokens[r]) - vocab_begin;
    if (row >= 0 && row < rows) std::copy(wte + row * C, wte + (row + 1) * C, o);
    else std::fill(o, o + C, 0.0f);
  }
}

void embedding_backward_shard(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int C, int64_t vocab_begin, int64_t rows) {
  check_shape(N, C);
  check_tokens(tokens, N);
  const int nblocks = col_blocks(C);
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t r = 0; r < N; r++) {
      const int64_t row = int64_t(tokens[r]) - vocab_begin;
      if (row < 0 || row >= rows) continue;
      float* w = dwte + row * C;
      const float* g = dout + r * C;
      for (int c = c0; c < c1; c++) w[c] += g[c];
    }
  }
}

void position_add(float* out, const float* wpe, const int32_t* positions, int64_t n, int C) {
  check_shape(n, C);
  check_positions(positions, n, std::nullopt);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float* p = wpe + static_cast<int64_t>(positions[i]) * C;
    float* o = out + i * C;
    for (int c = 0; c < C; c++) o[c] += p[c];
  }
}

void position_backward(float* dwpe, const float* dout, const int32_t* positions, int64_t n, int C) {
  check_shape(n, C);
  check_positions(positions, n, std::nullopt);
  const int nblocks = col_blocks(C);
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kColBlock;
    scatter_block(dwpe, dout, positions, n, C, c0, std::min(C, c0 + kColBlock));
  }
}

}  // namespace cleave::kernels
