// Packing a linear layer's weight into the blocked layouts oneDNN's matmul asks for.
//
// A step changes every weight, so every weight is packed again: for forward (B = W^T) and for
// backward_input (B = W), fp32 or bf16. oneDNN's reorder does one layout per pass over W, at
// about half of memcpy's speed on cold weights; pack_weight reads W once, in bands of rows that
// stay in L2, and writes every layout from that band, 2-2.5x faster (docs/performance.md).
#pragma once
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace cleave::kernels {

// A 2-D blocked layout of a logical [rows, cols] matrix. Element (r, c) lives at element offset
//   (r / block_rows) * row_block_stride + (c / block_cols) * col_block_stride
//     + inner[(r % block_rows) * block_cols + c % block_cols]
// and everything up to padded_rows x padded_cols that is not an element is zero.
struct BlockedLayout {
  int64_t rows = 0, cols = 0, padded_rows = 0, padded_cols = 0;
  int64_t block_rows = 1, block_cols = 1;
  int64_t row_block_stride = 0, col_block_stride = 0;
  std::vector<int32_t> inner;  // block_rows * block_cols offsets within a block
  bool bf16 = false;           // element type: bf16, else fp32
  // The blocks oneDNN's AVX-512 matmul uses, which have vector code: fp32 16 x 64 stored row by
  // row ("BA16a64b"), bf16 32 x 64 with rows 2k and 2k + 1 interleaved ("BA16a64b2a").
  enum class Kind { generic, f32_16x64, bf16_32x64 } kind = Kind::generic;
};

// The layout `md` describes, or nullopt when it is not a dense 2-D fp32 or bf16 blocked layout
// without offsets (the caller then falls back to oneDNN's reorder).
std::optional<BlockedLayout> blocked_layout(const dnnl::memory::desc& md);

struct PackTarget {
  const BlockedLayout* layout;
  bool transposed;  // the logical matrix is W^T [in, out] (forward's B), else W [out, in]
  void* dst;        // layout storage, 64-byte aligned
  bool streaming;   // not read soon: written around the cache
};

// Writes W [out, in] (row-major fp32) into every target in one pass over W.
void pack_weight(const float* w, int64_t out, int64_t in, std::span<const PackTarget> targets);

// For a caller that packs W band by band as it writes W (an optimizer step): the rows of a band,
// and pack_weight for the bands in rows [row0, row1) only, serially, so that calls for disjoint
// bands may run in parallel. row0 is a multiple of the band; a row1 at or past `out` also covers
// the padding rows of the layouts.
int64_t pack_band_rows(int64_t out, int64_t in, std::span<const PackTarget> targets);
void pack_weight_rows(const float* w, int64_t out, int64_t in,
                      std::span<const PackTarget> targets, int64_t row0, int64_t row1);

// Whether md is a plain 2-D layout: no inner blocks, only strides.
bool is_plain(const dnnl::memory::desc& md);

// W [out, in] row-major as the logical matrix of a target: W^T [in, out] through strides when
// transposed, else W; in fp32 unless `type` says otherwise.
dnnl::memory::desc user_weight_desc(int64_t out, int64_t in, bool transposed,
                                    dnnl::memory::data_type type = dnnl::memory::data_type::f32);

// The layouts oneDNN's matmul prefers for W as the B operand of x[N, in] W^T (forward) and of
// dy[N, out] W (backward_input), with operands in fp32 or bf16.
struct PreferredLayouts {
  dnnl::memory::desc forward, backward_input;
};
PreferredLayouts preferred_weight_layouts(int64_t N, int64_t in, int64_t out, bool bf16);
// Whether either of them is a layout this packer writes: AVX-512's blocked layouts are; an
// AVX2-only CPU's matmul reads its weights plain, which oneDNN's reorder transposes if at all.
bool packer_writes_layouts(int64_t N, int64_t in, int64_t out, bool bf16);

}  // namespace cleave::kernels
