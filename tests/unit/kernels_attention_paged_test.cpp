// Attention over a paged key/value cache: each query of a ragged batch gets bit for bit what the
// training kernel gives it over its sequence's keys laid out in one piece, wherever its blocks
// lie in the pool and whatever else is in the batch; from a bf16 cache, what it gives over the
// keys and values rounded to bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"

namespace cleave::kernels {
namespace {

struct Seq {
  int64_t past, rows;
};

void check_paged_matches_whole(int heads, int kv_heads, int hd, int64_t block_rows,
                               const std::vector<Seq>& seqs, bool bf16_cache = false) {
  const int64_t kv = int64_t(kv_heads) * hd, qd = int64_t(heads) * hd;
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t N = 0, blocks = 0;
  for (const Seq& s : seqs) {
    N += s.rows;
    blocks += (s.past + s.rows + block_rows - 1) / block_rows;
  }
  // The pool's blocks handed out in a scrambled order, so no sequence's blocks lie in order.
  std::vector<int32_t> order(size_t(blocks + 3));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<float> pool_k(order.size() * block_rows * kv, 9.0f), pool_v = pool_k;
  std::vector<float> q(size_t(N * qd)), out(size_t(N * qd)), lse(size_t(N * heads));
  std::vector<std::vector<int32_t>> tables(seqs.size());
  std::vector<int64_t> rows{0}, past;
  std::vector<const int32_t*> table_ptrs;
  std::vector<std::vector<float>> want_out(seqs.size()), want_lse(seqs.size());
  size_t next_block = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t T = seqs[i].past + seqs[i].rows, row0 = rows.back();
    std::vector<float> sq(size_t(T * qd)), sk(size_t(T * kv)), sv(size_t(T * kv));
    for (auto* v : {&sq, &sk, &sv})
      for (float& x : *v) x = nd(gen);
    if (bf16_cache)
      for (auto* v : {&sk, &sv})
        for (float& x : *v) x = from_bf16(to_bf16(x));
    // The whole sequence through the training kernel.
    AttentionShape shape;
    shape.B = 1, shape.T = T, shape.n_heads = heads, shape.n_kv_heads = kv_heads, shape.head_dim = hd;
    shape.q_row_stride = qd, shape.kv_row_stride = kv;
    std::vector<float> o(size_t(T * qd)), l(size_t(T * heads));
    attention_forward(o.data(), l.data(), sq.data(), sk.data(), sv.data(), shape);
    want_out[i].assign(o.begin() + seqs[i].past * qd, o.end());
    for (int h = 0; h < heads; ++h)
      for (int64_t t = seqs[i].past; t < T; ++t) want_lse[i].push_back(l[size_t(h * T + t)]);
    // The same keys in the pool, the new queries in the batch.
    for (int64_t b = 0; b * block_rows < T; ++b) tables[i].push_back(order[next_block++]);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t block = tables[i][size_t(t / block_rows)] * block_rows * kv, r = t % block_rows;
      for (int64_t c = 0; c < kv; ++c) pool_k[size_t(block + c * block_rows + r)] = sk[size_t(t * kv + c)];
      std::memcpy(&pool_v[size_t(block + r * kv)], &sv[size_t(t * kv)], kv * sizeof(float));
    }
    std::memcpy(&q[size_t(row0 * qd)], &sq[size_t(seqs[i].past * qd)], seqs[i].rows * qd * sizeof(float));
    rows.push_back(row0 + seqs[i].rows);
    past.push_back(seqs[i].past);
  }
  for (auto& t : tables) table_ptrs.push_back(t.data());
  PagedAttention p;
  p.n_heads = heads, p.n_kv_heads = kv_heads, p.head_dim = hd, p.q_row_stride = qd;
  p.k = pool_k.data(), p.v = pool_v.data(), p.kv_row_stride = kv, p.block_rows = block_rows;
  p.sequences = int64_t(seqs.size()), p.rows = rows.data(), p.past = past.data();
  p.blocks = table_ptrs.data();
  std::vector<bf16> pool_k16(pool_k.size()), pool_v16(pool_v.size());
  if (bf16_cache) {  // the same pool in bf16 (each value exact: rounded above)
    std::transform(pool_k.begin(), pool_k.end(), pool_k16.begin(), to_bf16);
    std::transform(pool_v.begin(), pool_v.end(), pool_v16.begin(), to_bf16);
    p.k = p.v = nullptr;
    p.k_bf16 = pool_k16.data(), p.v_bf16 = pool_v16.data();
  }
  attention_forward_paged(out.data(), lse.data(), q.data(), p);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t r0 = rows[i], n = seqs[i].rows;
    EXPECT_EQ(0, std::memcmp(&out[size_t(r0 * qd)], want_out[i].data(), n * qd * sizeof(float)))
        << "sequence " << i << " (past " << seqs[i].past << ", " << n << " rows): output";
    for (int h = 0; h < heads; ++h)
      for (int64_t t = 0; t < n; ++t)
        ASSERT_EQ(lse[size_t(h * N + r0 + t)], want_lse[i][size_t(h * n + t)])
            << "sequence " << i << " head " << h << " row " << t;
  }
}

// Prefill chunks, single decode tokens, a chunk crossing key blocks, queries that start mid-block.
const std::vector<Seq> kMixed = {{0, 70}, {130, 1}, {64, 64}, {5, 3}, {200, 37}, {127, 1}};

TEST(PagedAttention, MatchesWholeSequenceBitwiseMha) { check_paged_matches_whole(4, 4, 64, 64, kMixed); }
TEST(PagedAttention, MatchesWholeSequenceBitwiseGqaOddHeadDim) {
  check_paged_matches_whole(6, 2, 40, 64, kMixed);
}
TEST(PagedAttention, MatchesWholeSequenceBitwiseLargerBlocks) {
  check_paged_matches_whole(4, 2, 32, 128, kMixed);
}
TEST(PagedAttention, Bf16CacheMatchesWholeSequenceOfRoundedKeysBitwise) {
  check_paged_matches_whole(4, 4, 64, 64, kMixed, true);
  check_paged_matches_whole(6, 2, 40, 64, kMixed, true);
  check_paged_matches_whole(4, 2, 32, 128, kMixed, true);
}
TEST(PagedAttention, OneSequenceAloneOrAmongOthers) {
  check_paged_matches_whole(4, 2, 32, 64, {{100, 1}});
  check_paged_matches_whole(4, 2, 32, 64, {{3, 1}, {100, 1}, {0, 9}});
}

TEST(PagedAttention, BadInputThrows) {
  std::vector<float> pool(64 * 8, 0.0f), q(8), out(8), lse(1);
  std::vector<int64_t> rows{0, 1}, past{0};
  std::vector<int32_t> table{0};
  const int32_t* tables[] = {table.data()};
  PagedAttention p;
  p.n_heads = 1, p.n_kv_heads = 1, p.head_dim = 8, p.q_row_stride = 8;
  p.k = pool.data(), p.v = pool.data(), p.kv_row_stride = 8, p.block_rows = 64;
  p.sequences = 1, p.rows = rows.data(), p.past = past.data(), p.blocks = tables;
  attention_forward_paged(out.data(), lse.data(), q.data(), p);
  PagedAttention bad = p;
  bad.block_rows = 48;  // a key block would straddle two pool blocks
  EXPECT_THROW(attention_forward_paged(out.data(), lse.data(), q.data(), bad), Error);
  std::vector<bf16> pool16(pool.size());
  bad = p;
  bad.k_bf16 = pool16.data();  // fp32 keys beside bf16 ones
  EXPECT_THROW(attention_forward_paged(out.data(), lse.data(), q.data(), bad), Error);
  bad.k = nullptr;  // bf16 keys, fp32 values
  EXPECT_THROW(attention_forward_paged(out.data(), lse.data(), q.data(), bad), Error);
  bad = p;
  std::vector<int64_t> backwards{0, 1, 0};
  bad.rows = backwards.data(), bad.sequences = 2;
  std::vector<int64_t> past2{0, 0};
  const int32_t* tables2[] = {table.data(), table.data()};
  bad.past = past2.data(), bad.blocks = tables2;
  EXPECT_THROW(attention_forward_paged(out.data(), lse.data(), q.data(), bad), Error);
}

}  // namespace
}  // namespace cleave::kernels
