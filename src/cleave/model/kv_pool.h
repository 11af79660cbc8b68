// The key/value cache of inference, paged (vLLM's PagedAttention): a pool of fixed-size blocks,
// each holding the keys and values of block_rows consecutive tokens of a sequence in every layer
// this rank holds (its kv heads under tp, its layers under pp). A sequence's block table lists
// its blocks in token order, so sequences of any length share one pool without fragmenting it.
// Blocks are counted by reference: sequences with a common prefix hold its blocks once, and a
// shared block is copied before a sequence writes into it. The keys and values are kept in fp32
// (the trainer's forward, bit for bit) or bf16 (half the memory and the bytes each decoding
// step reads, as vLLM's and llama.cpp's 16-bit caches; a query gets what it would get over
// fp32 keys and values of the rounded values).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/base/bf16.h"
#include "cleave/base/buffer.h"

namespace cleave {

enum class KvDtype { fp32, bf16 };
std::string kv_dtype_name(KvDtype dtype);
int64_t kv_dtype_bytes(KvDtype dtype);
// "fp32", "bf16", or "auto": the weights' dtype (`weights`, "fp32" or "bf16"); a clear error
// naming `what` (the setting) otherwise.
KvDtype parse_kv_dtype(const std::string& name, const std::string& weights, const std::string& what);

// What one layer's attention reads and writes: block b's keys and values start at
// k (v) + b * block_rows * row, a token's row holding the rank's kv heads (row values); values as
// rows, keys transposed (kernels::PagedAttention). Either k and v (fp32) or k_bf16 and v_bf16.
struct KvLayer {
  float* k = nullptr;
  float* v = nullptr;
  bf16* k_bf16 = nullptr;
  bf16* v_bf16 = nullptr;
  int64_t block_rows = 0, row = 0;
};

class KvPool {
 public:
  // blocks of block_rows tokens (a multiple of kernels::kAttentionKeyBlock) for `layers` layers of
  // kv rows of `row` values. Memory is mapped, not touched: a block costs memory once written.
  // No layers: the books alone, of a pool another rank holds (a server's other ep ranks').
  KvPool(int layers, int64_t row, int64_t block_rows, int64_t blocks, KvDtype dtype = KvDtype::fp32);
  int layers() const { return layers_; }
  KvDtype dtype() const { return dtype_; }
  int64_t block_rows() const { return block_rows_; }
  int64_t row() const { return row_; }
  int64_t blocks() const { return int64_t(refs_.size()); }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  KvLayer layer(int l);
  // Writes every block once, so that its pages are the process's before any request: a server
  // takes its whole cache at start-up (as llama.cpp's does) instead of faulting pages in, with
  // the kernel's huge-page compaction, in the middle of its steps.
  void touch_all();

  // A free block, held once; a clear error when every block is in use.
  int32_t allocate();
  void retain(int32_t block);   // one more holder
  void release(int32_t block);  // one fewer; free when none is left
  int refs(int32_t block) const;

 private:
  void check_block(int32_t block, const char* what) const;
  int layers_;
  int64_t row_, block_rows_;
  KvDtype dtype_;
  std::vector<Buffer<float>> k_, v_;          // fp32, per layer: [blocks][block_rows][row]
  std::vector<Buffer<bf16>> k_bf16_, v_bf16_;  // or bf16
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the lowest block is handed out first
};

// One sequence's tokens in a pool: its block table and how many tokens the blocks hold.
struct SequenceCache {
  std::vector<int32_t> blocks;
  int64_t length = 0;
};

// Blocks for the sequence's tokens up to `tokens` (more than it holds), taking free blocks; the
// block the next token goes into, when shared, is first copied (copy-on-write). The length is
// the caller's to advance once the tokens are written. Nothing is taken when the pool cannot
// hold them all: a clear error instead.
void reserve_tokens(KvPool& pool, SequenceCache& seq, int64_t tokens);
// Another holder of the first `tokens` tokens of seq's blocks (a shared prefix).
SequenceCache share_prefix(KvPool& pool, const SequenceCache& seq, int64_t tokens);
// Gives every block back.
void release_sequence(KvPool& pool, SequenceCache& seq);

}  // namespace cleave
