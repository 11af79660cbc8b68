// pack_weight: W is read in bands of rows, each band as many rows as the targets' blocks need to
// be whole (64 for oneDNN's fp32 and bf16 matmul layouts: a band of 64 x 3,072 fp32 is 768 KiB,
// within one core's L2, brought in as one sequential stream first). For each target, every block
// the band covers is written whole: by vector code for the two block shapes oneDNN's AVX-512
// matmul uses, else assembled in a small aligned buffer through the layout's offset table. The
// copy that the product about to run reads is stored through the cache; the others, read only
// later (in backward), are streamed around it.
#include "cleave/kernels/weight_pack.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>

#include "cleave/base/bf16.h"
#include "cleave/base/bf16_round.h"
#include "cleave/base/check.h"
#include "cleave/kernels/linear.h"
#include "cleave/kernels/transpose16.h"

namespace cleave::kernels {
namespace {

constexpr int64_t kMaxBlockElements = 1 << 16;

void store_block(char* dst, const char* block, size_t bytes, bool streaming) {
#ifdef __AVX512F__
  if (streaming && bytes % 64 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {
    for (size_t i = 0; i < bytes; i += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                          _mm512_load_si512(reinterpret_cast<const void*>(block + i)));
    return;
  }
#endif
  std::memcpy(dst, block, bytes);
}

template <typename T>
T narrow(float x) {
  if constexpr (sizeof(T) == 2)
    return to_bf16(x);
  else
    return x;
}

// Assembles block (rb, cb) of the logical matrix (W, or W^T when transposed) in `stage`.
template <typename T>
void assemble_block(T* stage, const BlockedLayout& L, bool transposed, const float* w, int64_t in,
                    int64_t rb, int64_t cb) {
  const int64_t BR = L.block_rows, BC = L.block_cols;
  const int64_t r0 = rb * BR, c0 = cb * BC;
  const int64_t nr = std::min(BR, L.rows - r0), nc = std::min(BC, L.cols - c0);
  if (nr < BR || nc < BC) std::fill(stage, stage + BR * BC, T(0));
  const int32_t* inner = L.inner.data();
  if (!transposed) {
    for (int64_t dr = 0; dr < nr; ++dr) {
      const float* src = w + (r0 + dr) * in + c0;
      const int32_t* at = inner + dr * BC;
      for (int64_t dc = 0; dc < nc; ++dc) stage[at[dc]] = narrow<T>(src[dc]);
    }
  } else {
    // Logical (r, c) is W[c][r]: walk each row of W that the block covers.
    for (int64_t dc = 0; dc < nc; ++dc) {
      const float* src = w + (c0 + dc) * in + r0;
      for (int64_t dr = 0; dr < nr; ++dr) stage[inner[dr * BC + dc]] = narrow<T>(src[dr]);
    }
  }
}

#ifdef __AVX512F__
// to_bf16 on 16 values, each in the low half of a 32-bit lane.
__m512i bf16_lanes(const float* x) { return _mm512_cvtepu16_epi32(bf16_round(_mm512_loadu_ps(x))); }

void put(void* dst, __m512i v, bool streaming) {
  if (streaming)
    _mm512_stream_si512(static_cast<__m512i*>(dst), v);
  else
    _mm512_store_si512(dst, v);
}

// One whole 16 x 64 block at dst. Logical (r, c) is W[r0 + r][c0 + c], or W[c0 + c][r0 + r]
// when transposed.
void f32_block(float* dst, const float* w, int64_t in, int64_t r0, int64_t c0, bool transposed,
               bool streaming) {
  if (!transposed) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 64; c += 16)
        put(dst + r * 64 + c, _mm512_castps_si512(_mm512_loadu_ps(w + (r0 + r) * in + c0 + c)),
            streaming);
    return;
  }
  for (int c = 0; c < 64; c += 16) {
    __m512 rows[16];
    for (int i = 0; i < 16; ++i) rows[i] = _mm512_loadu_ps(w + (c0 + c + i) * in + r0);
    transpose16(rows);
    for (int r = 0; r < 16; ++r) put(dst + r * 64 + c, _mm512_castps_si512(rows[r]), streaming);
  }
}

// One whole 32 x 64 bf16 block: rows 2k and 2k + 1 of a column share a 32-bit word, at word
// k * 64 + c.
void bf16_block(bf16* dst, const float* w, int64_t in, int64_t r0, int64_t c0, bool transposed,
                bool streaming) {
  auto* out = reinterpret_cast<uint32_t*>(dst);
  if (!transposed) {
    for (int k = 0; k < 16; ++k) {
      const float* even = w + (r0 + 2 * k) * in + c0;
      const float* odd = even + in;
      for (int c = 0; c < 64; c += 16) {
        const __m512i pair =
            _mm512_or_si512(bf16_lanes(even + c), _mm512_slli_epi32(bf16_lanes(odd + c), 16));
        put(out + k * 64 + c, pair, streaming);
      }
    }
    return;
  }
  // Transposed, a row of W gives one column: its 32 values of r make its 16 words, adjacent
  // already. 16 rows at a time, a 16 x 16 transpose of the words gives word k of 16 columns.
  for (int c = 0; c < 64; c += 16) {
    __m512 rows[16];
    for (int i = 0; i < 16; ++i) {
      const float* row = w + (c0 + c + i) * in + r0;
      const __m256i lo = bf16_round(_mm512_loadu_ps(row));
      const __m256i hi = bf16_round(_mm512_loadu_ps(row + 16));
      rows[i] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    transpose16(rows);
    for (int k = 0; k < 16; ++k) put(out + k * 64 + c, _mm512_castps_si512(rows[k]), streaming);
  }
}
#endif

// Every block of `t` whose rows of W lie in [w_row0, w_row1).
template <typename T>
void pack_band(const PackTarget& t, const float* w, int64_t in, int64_t w_row0, int64_t w_row1,
               T* stage) {
  const BlockedLayout& L = *t.layout;
  const int64_t BR = L.block_rows, BC = L.block_cols;
  const size_t block_bytes = size_t(BR * BC) * sizeof(T);
  char* dst = static_cast<char*>(t.dst);
  auto place = [&](int64_t rb, int64_t cb) {
    const int64_t offset = rb * L.row_block_stride + cb * L.col_block_stride;
    T* block = reinterpret_cast<T*>(dst) + offset;
#ifdef __AVX512F__
    const bool whole = (rb + 1) * BR <= L.rows && (cb + 1) * BC <= L.cols;
    if (whole && L.kind == BlockedLayout::Kind::f32_16x64) {
      f32_block(reinterpret_cast<float*>(block), w, in, rb * BR, cb * BC, t.transposed,
                t.streaming);
      return;
    }
    if (whole && L.kind == BlockedLayout::Kind::bf16_32x64) {
      bf16_block(reinterpret_cast<bf16*>(block), w, in, rb * BR, cb * BC, t.transposed,
                 t.streaming);
      return;
    }
#endif
    assemble_block(stage, L, t.transposed, w, in, rb, cb);
    store_block(reinterpret_cast<char*>(block), reinterpret_cast<const char*>(stage),
                block_bytes, t.streaming);
  };
  if (!t.transposed) {
    const int64_t rb1 = std::min(w_row1, L.padded_rows) / BR;
    for (int64_t rb = w_row0 / BR; rb < rb1; ++rb)
      for (int64_t cb = 0; cb < L.padded_cols / BC; ++cb) place(rb, cb);
  } else {
    const int64_t cb1 = std::min(w_row1, L.padded_cols) / BC;
    for (int64_t cb = w_row0 / BC; cb < cb1; ++cb)
      for (int64_t rb = 0; rb < L.padded_rows / BR; ++rb) place(rb, cb);
  }
}

}  // namespace

std::optional<BlockedLayout> blocked_layout(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 2 || d.format_kind != dnnl_blocked) return std::nullopt;
  if (d.data_type != dnnl_f32 && d.data_type != dnnl_bf16) return std::nullopt;
  if (d.offset0 != 0 || d.padded_offsets[0] != 0 || d.padded_offsets[1] != 0) return std::nullopt;
  if (d.extra.flags != dnnl_memory_extra_flag_none) return std::nullopt;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  BlockedLayout L;
  L.bf16 = d.data_type == dnnl_bf16;
  L.rows = d.dims[0];
  L.cols = d.dims[1];
  L.padded_rows = d.padded_dims[0];
  L.padded_cols = d.padded_dims[1];
  int64_t block[2] = {1, 1};
  for (int i = 0; i < b.inner_nblks; ++i) block[b.inner_idxs[i]] *= b.inner_blks[i];
  L.block_rows = block[0];
  L.block_cols = block[1];
  const int64_t elements_per_block = L.block_rows * L.block_cols;
  const int64_t element_bytes = L.bf16 ? 2 : 4;
  // Blocks of less than a cache line (plain layouts, transposes) are not worth it block by block.
  if (elements_per_block * element_bytes < 64 || elements_per_block > kMaxBlockElements)
    return std::nullopt;
  if (L.padded_rows % L.block_rows != 0 || L.padded_cols % L.block_cols != 0) return std::nullopt;
  L.row_block_stride = b.strides[0];
  L.col_block_stride = b.strides[1];
  // Dense: the blocks tile the storage exactly, one after the other in some order.
  const int64_t nblocks = (L.padded_rows / L.block_rows) * (L.padded_cols / L.block_cols);
  const int64_t last = (L.padded_rows / L.block_rows - 1) * L.row_block_stride +
                       (L.padded_cols / L.block_cols - 1) * L.col_block_stride +
                       elements_per_block;
  if (int64_t(md.get_size()) != nblocks * elements_per_block * element_bytes ||
      last != nblocks * elements_per_block)
    return std::nullopt;
  L.inner.resize(size_t(elements_per_block));
  for (int64_t dr = 0; dr < L.block_rows; ++dr)
    for (int64_t dc = 0; dc < L.block_cols; ++dc) {
      const int64_t pos[2] = {dr, dc};
      int64_t offset = 0;
      for (int i = 0; i < b.inner_nblks; ++i) {
        const int dim = int(b.inner_idxs[i]);
        int64_t finer = 1;  // the product of this dimension's blocks inside this one
        for (int j = i + 1; j < b.inner_nblks; ++j)
          if (b.inner_idxs[j] == dim) finer *= b.inner_blks[j];
        offset = offset * b.inner_blks[i] + (pos[dim] / finer) % b.inner_blks[i];
      }
      L.inner[size_t(dr * L.block_cols + dc)] = int32_t(offset);
    }
  if (L.block_cols == 64 && L.block_rows == (L.bf16 ? 32 : 16)) {
    bool matches = true;
    for (int64_t dr = 0; dr < L.block_rows; ++dr)
      for (int64_t dc = 0; dc < 64; ++dc) {
        const int32_t at = L.inner[size_t(dr * 64 + dc)];
        matches = matches && at == (L.bf16 ? (dr / 2) * 128 + dc * 2 + dr % 2 : dr * 64 + dc);
      }
    if (matches) L.kind = L.bf16 ? BlockedLayout::Kind::bf16_32x64 : BlockedLayout::Kind::f32_16x64;
  }
  return L;
}

namespace {

struct Bands {
  int64_t rows = 1;        // per band
  int64_t count = 0;       // bands covering every target's padded rows
  size_t stage_bytes = 0;  // for the largest block
};

Bands bands_of(int64_t out, int64_t in, std::span<const PackTarget> targets) {
  Bands b;
  int64_t w_rows = 0, stage_elements = 0;
  for (const PackTarget& t : targets) {
    const BlockedLayout& L = *t.layout;
    const int64_t want_rows = t.transposed ? in : out, want_cols = t.transposed ? out : in;
    CLEAVE_CHECK(L.rows == want_rows && L.cols == want_cols,
                 "pack_weight: layout of " << L.rows << "x" << L.cols << " for a weight of "
                                           << out << "x" << in
                                           << (t.transposed ? " transposed" : ""));
    CLEAVE_CHECK(reinterpret_cast<uintptr_t>(t.dst) % 64 == 0, "pack_weight: unaligned target");
    b.rows = std::lcm(b.rows, t.transposed ? L.block_cols : L.block_rows);
    w_rows = std::max(w_rows, t.transposed ? L.padded_cols : L.padded_rows);
    stage_elements = std::max(stage_elements, L.block_rows * L.block_cols);
  }
  b.count = (w_rows + b.rows - 1) / b.rows;
  b.stage_bytes = (size_t(stage_elements) * 4 + 63) / 64 * 64;
  return b;
}

// Band i of every target, the sequential (non-transposed) layouts first.
void pack_one_band(const float* w, int64_t out, int64_t in, std::span<const PackTarget> targets,
                   int64_t band_rows, int64_t i, void* stage) {
  // Into L2 as one sequential stream: a transposed target reads the band 64 bytes of a row at a
  // time, as many rows at once as its blocks have, which the prefetchers miss.
  const int64_t r1 = std::min(out, (i + 1) * band_rows);
  if (i * band_rows < r1) {
    const char* first = reinterpret_cast<const char*>(w + i * band_rows * in);
    const char* last = reinterpret_cast<const char*>(w + r1 * in);
    for (const char* line = first; line < last; line += 64) _mm_prefetch(line, _MM_HINT_T1);
  }
  for (bool transposed : {false, true})
    for (const PackTarget& t : targets) {
      if (t.transposed != transposed) continue;
      if (t.layout->bf16)
        pack_band(t, w, in, i * band_rows, (i + 1) * band_rows, static_cast<bf16*>(stage));
      else
        pack_band(t, w, in, i * band_rows, (i + 1) * band_rows, static_cast<float*>(stage));
    }
}

using StageBuffer = std::unique_ptr<void, decltype(&std::free)>;

StageBuffer stage_buffer(size_t bytes) {
  StageBuffer stage(std::aligned_alloc(64, bytes), &std::free);
  CLEAVE_CHECK(stage != nullptr, "pack_weight: out of memory for " << bytes << " bytes");
  return stage;
}

}  // namespace

void pack_weight(const float* w, int64_t out, int64_t in, std::span<const PackTarget> targets) {
  const Bands bands = bands_of(out, in, targets);
  StageBuffer stages = stage_buffer(bands.stage_bytes * size_t(omp_get_max_threads()));
#pragma omp parallel
  {
    void* stage =
        static_cast<char*>(stages.get()) + bands.stage_bytes * size_t(omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < bands.count; ++i)
      pack_one_band(w, out, in, targets, bands.rows, i, stage);
#ifdef __AVX512F__
    _mm_sfence();  // streaming stores are visible before the threads join
#endif
  }
}

int64_t pack_band_rows(int64_t out, int64_t in, std::span<const PackTarget> targets) {
  return bands_of(out, in, targets).rows;
}

void pack_weight_rows(const float* w, int64_t out, int64_t in,
                      std::span<const PackTarget> targets, int64_t row0, int64_t row1) {
  const Bands bands = bands_of(out, in, targets);
  CLEAVE_CHECK(row0 % bands.rows == 0 && row1 > row0,
               "pack_weight_rows: rows " << row0 << ".." << row1 << " for bands of " << bands.rows);
  const int64_t last = row1 >= out ? bands.count : (row1 + bands.rows - 1) / bands.rows;
  StageBuffer stage = stage_buffer(bands.stage_bytes);
  for (int64_t i = row0 / bands.rows; i < last; ++i)
    pack_one_band(w, out, in, targets, bands.rows, i, stage.get());
#ifdef __AVX512F__
  _mm_sfence();
#endif
}

bool is_plain(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  return d.ndims == 2 && d.format_kind == dnnl_blocked && d.format_desc.blocking.inner_nblks == 0 &&
         d.extra.flags == dnnl_memory_extra_flag_none;
}

dnnl::memory::desc user_weight_desc(int64_t out, int64_t in, bool transposed,
                                    dnnl::memory::data_type type) {
  using dnnl::memory;
  return transposed ? memory::desc({in, out}, type, memory::dims{1, in})
                    : memory::desc({out, in}, type, memory::dims{in, 1});
}

PreferredLayouts preferred_weight_layouts(int64_t N, int64_t in, int64_t out, bool bf16) {
  using dnnl::memory;
  const auto type =
      bf16 && native_bf16_products() ? memory::data_type::bf16 : memory::data_type::f32;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto weights = [&](int64_t k, int64_t n) {
    const memory::desc src({N, k}, type, memory::format_tag::ab);
    const memory::desc wei({k, n}, type, memory::format_tag::any);
    const memory::desc dst({N, n}, memory::data_type::f32, memory::format_tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), engine).weights_desc();
  };
  return {weights(in, out), weights(out, in)};
}

bool packer_writes_layouts(int64_t N, int64_t in, int64_t out, bool bf16) {
  const PreferredLayouts want = preferred_weight_layouts(N, in, out, bf16);
  return blocked_layout(want.forward) || blocked_layout(want.backward_input);
}

}  // namespace cleave::kernels
