#include "cleave/model/kv_pool.h"

#include <algorithm>
#include <cstring>

#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"

namespace cleave {

std::string kv_dtype_name(KvDtype dtype) { return dtype == KvDtype::bf16 ? "bf16" : "fp32"; }

int64_t kv_dtype_bytes(KvDtype dtype) { return dtype == KvDtype::bf16 ? 2 : 4; }

KvDtype parse_kv_dtype(const std::string& name, const std::string& weights, const std::string& what) {
  const std::string& dtype = name == "auto" ? weights : name;
  if (dtype == "fp32") return KvDtype::fp32;
  if (dtype == "bf16") return KvDtype::bf16;
  throw Error(what + " must be auto, fp32 or bf16, not '" + name + "'");
}

KvPool::KvPool(int layers, int64_t row, int64_t block_rows, int64_t blocks, KvDtype dtype)
    : layers_(layers), row_(row), block_rows_(block_rows), dtype_(dtype) {
  CLEAVE_CHECK(layers >= 0 && row > 0, "a key/value pool of " << layers << " layers of rows of "
                                                            << row << " floats");
  CLEAVE_CHECK(block_rows > 0 && block_rows % kernels::kAttentionKeyBlock == 0,
               "key/value blocks of " << block_rows << " tokens: they must hold a multiple of "
                                      << kernels::kAttentionKeyBlock << " tokens");
  CLEAVE_CHECK(blocks > 0 && blocks <= INT32_MAX,
               "a key/value pool of " << blocks << " blocks (1 to " << INT32_MAX << ")");
  const auto make = [&](auto& k, auto& v) {
    k.resize(size_t(layers));
    v.resize(size_t(layers));
    for (int l = 0; l < layers; ++l) {
      k[size_t(l)].resize(blocks * block_rows * row);
      v[size_t(l)].resize(blocks * block_rows * row);
    }
  };
  if (dtype == KvDtype::bf16) make(k_bf16_, v_bf16_);
  else make(k_, v_);
  refs_.assign(size_t(blocks), 0);
  free_.resize(size_t(blocks));
  for (int64_t b = 0; b < blocks; ++b) free_[size_t(b)] = int32_t(blocks - 1 - b);
}

KvLayer KvPool::layer(int l) {
  CLEAVE_CHECK(l >= 0 && l < layers(), "layer " << l << " of a key/value pool of " << layers());
  if (dtype_ == KvDtype::bf16)
    return {nullptr, nullptr, k_bf16_[size_t(l)].data(), v_bf16_[size_t(l)].data(), block_rows_, row_};
  return {k_[size_t(l)].data(), v_[size_t(l)].data(), nullptr, nullptr, block_rows_, row_};
}

void KvPool::check_block(int32_t block, const char* what) const {
  CLEAVE_CHECK(block >= 0 && block < blocks() && refs_[size_t(block)] > 0,
               what << " block " << block << ", which is not in use (pool of " << blocks()
                    << " blocks)");
}

namespace {

template <class T>
void touch(std::vector<Buffer<T>>& layers) {
  constexpr int64_t kPage = 4096 / sizeof(T);
  for (Buffer<T>& b : layers) {
    T* p = b.data();
    const int64_t n = b.size();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += kPage) p[i] = T(0);
  }
}

// The first `rows` tokens of block `from` copied into block `to`, in every layer.
template <class T>
void copy_rows(T* k, T* v, int64_t br, int64_t row, int32_t to, int32_t from, int64_t rows) {
  const int64_t t = to * br * row, f = from * br * row;
  for (int64_t c = 0; c < row; ++c)  // keys are stored transposed: columns of br
    std::memcpy(k + t + c * br, k + f + c * br, rows * sizeof(T));
  std::memcpy(v + t, v + f, rows * row * sizeof(T));
}

}  // namespace

void KvPool::touch_all() {
  touch(k_), touch(v_), touch(k_bf16_), touch(v_bf16_);
}

int32_t KvPool::allocate() {
  CLEAVE_CHECK(!free_.empty(), "the key/value pool is full: all " << blocks() << " blocks of "
                                   << block_rows_ << " tokens are in use");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[size_t(b)] = 1;
  return b;
}

void KvPool::retain(int32_t block) {
  check_block(block, "retain of");
  ++refs_[size_t(block)];
}

void KvPool::release(int32_t block) {
  check_block(block, "release of");
  if (--refs_[size_t(block)] == 0) free_.push_back(block);
}

int KvPool::refs(int32_t block) const {
  CLEAVE_CHECK(block >= 0 && block < blocks(), "block " << block << " of a pool of " << blocks());
  return refs_[size_t(block)];
}

void reserve_tokens(KvPool& pool, SequenceCache& seq, int64_t tokens) {
  const int64_t br = pool.block_rows(), have = int64_t(seq.blocks.size());
  const int64_t need = (tokens + br - 1) / br;
  // The block the next token goes into, if it is partly filled and shared, is copied first.
  const int64_t partial = seq.length % br;
  const bool copy = tokens > seq.length && partial != 0 &&
                    pool.refs(seq.blocks[size_t(seq.length / br)]) > 1;
  const int64_t take = std::max<int64_t>(need - have, 0) + (copy ? 1 : 0);
  CLEAVE_CHECK(take <= pool.free_blocks(),
               "the key/value pool cannot hold " << tokens << " tokens of a sequence: it needs "
                   << take << " more blocks of " << br << " tokens and " << pool.free_blocks()
                   << " of " << pool.blocks() << " are free");
  if (copy) {
    int32_t& at = seq.blocks[size_t(seq.length / br)];
    const int32_t fresh = pool.allocate();
    for (int l = 0; l < pool.layers(); ++l) {
      const KvLayer kv = pool.layer(l);
      if (kv.k) copy_rows(kv.k, kv.v, br, kv.row, fresh, at, partial);
      else copy_rows(kv.k_bf16, kv.v_bf16, br, kv.row, fresh, at, partial);
    }
    pool.release(at);
    at = fresh;
  }
  while (int64_t(seq.blocks.size()) < need) seq.blocks.push_back(pool.allocate());
}

SequenceCache share_prefix(KvPool& pool, const SequenceCache& seq, int64_t tokens) {
  CLEAVE_CHECK(tokens >= 0 && tokens <= seq.length,
               "a prefix of " << tokens << " tokens of a sequence of " << seq.length);
  SequenceCache out;
  out.length = tokens;
  const int64_t n = (tokens + pool.block_rows() - 1) / pool.block_rows();
  out.blocks.assign(seq.blocks.begin(), seq.blocks.begin() + n);
  for (int32_t b : out.blocks) pool.retain(b);
  return out;
}

void release_sequence(KvPool& pool, SequenceCache& seq) {
  for (int32_t b : seq.blocks) pool.release(b);
  seq = SequenceCache();
}

}  // namespace cleave
