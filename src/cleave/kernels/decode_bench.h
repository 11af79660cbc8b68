// The kernels of a decoding step on GPT-2 124M's shape, 12 layers of d_model 768 and 12 heads of
// 64 (`cleave bench-decode`, docs/inference.md): what a bf16 key/value cache saves in attention,
// what running a call's row tiles as one product saves against tile by tile, and how widely the
// time of identical steps spreads on this machine, beside fixed arithmetic that touches no memory.
// Inputs are fixed pseudo-random values; each comparison alternates its two sides call by call.
#pragma once
#include <cstdint>
#include <vector>

namespace cleave {

// One layer's paged attention for `sequences` decoding queries (one row each) over contexts of
// min_context to max_context tokens, from an fp32 cache and from a bf16 one of the same values.
struct DecodeAttentionTiming {
  int sequences = 0;
  int64_t min_context = 0, max_context = 0;
  double fp32_seconds = 0, bf16_seconds = 0;  // median of one call
  double fp32_bytes = 0, bf16_bytes = 0;      // keys and values read by one call
  int calls = 0;                              // of each
};
DecodeAttentionTiming time_decode_attention(double budget);

// The 48 bf16 products of a step's linears on `rows` rows with row tiles on
// (LinearGemm::set_row_invariant): one call per linear against one call per tile of 16 rows.
struct RowTilesTiming {
  int64_t rows = 0;
  double one_call_seconds = 0, tile_calls_seconds = 0;  // median of the 48 products
  int pairs = 0;
};
std::vector<RowTilesTiming> time_row_tiles(const std::vector<int64_t>& rows, double budget);

// The spread of identical runs of one piece of work: its quantiles over `runs` runs.
struct Spread {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  int runs = 0;
};
// The 48 products of a step at `rows` rows, run again and again.
Spread step_products_spread(int64_t rows, double budget);
// Arithmetic on registers alone in every OpenMP thread, sized to take about `seconds` a run, run
// again and again: the spread that the machine adds to work which waits on nothing.
Spread fixed_arithmetic_spread(double seconds, double budget);

}  // namespace cleave
