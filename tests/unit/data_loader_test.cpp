#include "cleave/data/loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/data/tokens.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

class LoaderTest : public ::testing::Test {
 protected:
  cleave::test_util::TestDir tmp_{"cleave-data-loader"};

  // A shard whose token i is i % vocab, so a window's offset is readable from its first token.
  std::string make_shard(const std::string& name, uint32_t n, uint32_t vocab) {
    std::vector<uint32_t> tokens(n);
    for (uint32_t i = 0; i < n; ++i) tokens[i] = i % vocab;
    const std::string p = (dir_ / name).string();
    cleave::write_token_shard(p, tokens, vocab);
    return p;
  }

  const fs::path dir_ = tmp_.path();
};

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch fill(const cleave::BatchLoader& loader, uint64_t step, int64_t first, int64_t count,
           int64_t T) {
  Batch b{std::vector<int32_t>(size_t(count * T), -1), std::vector<int32_t>(size_t(count * T), -1)};
  loader.fill(b.inputs.data(), b.targets.data(), step, first, count);
  return b;
}

}  // namespace

TEST_F(LoaderTest, TargetsAreInputsShiftedByOne) {
  const uint32_t n = 5000;
  const std::string p = make_shard("a.bin", n, 70000);  // token i == i
  cleave::TokenShard shard(p, 70000);
  const int64_t T = 64, B = 16;
  cleave::BatchLoader loader(shard, T, 42, 0);
  const Batch b = fill(loader, 3, 0, B, T);
  for (int64_t r = 0; r < B; ++r) {
    const int32_t off = b.inputs[size_t(r * T)];
    ASSERT_GE(off, 0);
    ASSERT_LE(off, int32_t(n) - T - 1);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(b.inputs[size_t(r * T + t)], off + t);
      EXPECT_EQ(b.targets[size_t(r * T + t)], off + t + 1);
    }
  }
}

TEST_F(LoaderTest, Deterministic) {
  const std::string p = make_shard("a.bin", 10000, 1000);
  cleave::TokenShard shard(p, 1000);
  const int64_t T = 32, B = 8;
  cleave::BatchLoader l1(shard, T, 7, 0), l2(shard, T, 7, 0);
  for (uint64_t step : {0ull, 1ull, 1000000ull, (1ull << 40) + 5}) {
    const Batch a = fill(l1, step, 0, B, T), b = fill(l2, step, 0, B, T);
    EXPECT_EQ(a.inputs, b.inputs);
    EXPECT_EQ(a.targets, b.targets);
    const Batch c = fill(l1, step, 0, B, T);  // same loader, again
    EXPECT_EQ(a.inputs, c.inputs);
  }
}

TEST_F(LoaderTest, SubRangesMatchTheFullBatch) {
  const std::string p = make_shard("a.bin", 20000, 50000);
  cleave::TokenShard shard(p, 50000);
  const int64_t T = 16, B = 24;
  cleave::BatchLoader loader(shard, T, 123, 0);
  for (uint64_t step : {0ull, 17ull}) {
    const Batch full = fill(loader, step, 0, B, T);
    // Uneven slices, as data-parallel ranks might ask for.
    const std::vector<std::pair<int64_t, int64_t>> slices = {{0, 5}, {5, 1}, {6, 10}, {16, 8}};
    for (auto [first, count] : slices) {
      const Batch part = fill(loader, step, first, count, T);
      for (int64_t k = 0; k < count * T; ++k) {
        ASSERT_EQ(part.inputs[size_t(k)], full.inputs[size_t(first * T + k)]);
        ASSERT_EQ(part.targets[size_t(k)], full.targets[size_t(first * T + k)]);
      }
    }
  }
}

TEST_F(LoaderTest, DifferentStepsSeedsAndSplitsDiffer) {
  const std::string p = make_shard("a.bin", 100000, 200000);  // token i == i
  cleave::TokenShard shard(p, 200000);
  const int64_t T = 8, B = 16;
  cleave::BatchLoader base(shard, T, 1, 0), other_seed(shard, T, 2, 0), other_split(shard, T, 1, 1);
  const Batch s0 = fill(base, 0, 0, B, T);
  EXPECT_NE(s0.inputs, fill(base, 1, 0, B, T).inputs);
  EXPECT_NE(s0.inputs, fill(base, 1ull << 32, 0, B, T).inputs);  // high step bits matter
  EXPECT_NE(s0.inputs, fill(other_seed, 0, 0, B, T).inputs);
  EXPECT_NE(s0.inputs, fill(other_split, 0, 0, B, T).inputs);
  // Rows within a batch differ too.
  int distinct = 0;
  for (int64_t r = 1; r < B; ++r) distinct += s0.inputs[size_t(r * T)] != s0.inputs[0];
  EXPECT_GT(distinct, B / 2);
}

TEST_F(LoaderTest, OffsetsCoverTheWholeRange) {
  // Tiny shard: every legal offset 0..size-T-1 appears, nothing beyond.
  const uint32_t n = 20;
  const int64_t T = 5;
  const std::string p = make_shard("a.bin", n, 100);
  cleave::TokenShard shard(p, 100);
  cleave::BatchLoader loader(shard, T, 9, 0);
  std::vector<int> seen(n, 0);
  for (uint64_t step = 0; step < 200; ++step) {
    const Batch b = fill(loader, step, 0, 8, T);
    for (int64_t r = 0; r < 8; ++r) ++seen[size_t(b.inputs[size_t(r * T)])];
  }
  for (uint32_t off = 0; off < n; ++off) {
    if (off <= n - T - 1) EXPECT_GT(seen[off], 0) << "offset " << off;
    else EXPECT_EQ(seen[off], 0) << "offset " << off;
  }
}

TEST_F(LoaderTest, ExactMinimumSize) {
  const std::string p = make_shard("a.bin", 9, 100);
  cleave::TokenShard shard(p, 100);
  cleave::BatchLoader loader(shard, 8, 0, 0);
  const Batch b = fill(loader, 5, 0, 3, 8);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(b.inputs[size_t(r * 8)], 0);
    EXPECT_EQ(b.targets[size_t(r * 8 + 7)], 8);
  }
}

TEST_F(LoaderTest, ShardTooShortForSeqLen) {
  const std::string p = make_shard("short.bin", 8, 100);
  cleave::TokenShard shard(p, 100);
  try {
    cleave::BatchLoader loader(shard, 8, 0, 0);
    FAIL() << "no error";
  } catch (const cleave::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("has 8 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("seq_len 8"), std::string::npos) << msg;
  }
}

// Documents from separators: token i is i % 7, so separator 3 ends a document every 7 tokens.
// The separator belongs to the document it ends; positions restart right after it; the batch's
// other fields are those of whole windows.
TEST_F(LoaderTest, DocumentsAndPositionsFromSeparators) {
  const std::string p = make_shard("docs.bin", 3000, 7);
  cleave::TokenShard shard(p, 7);
  const int64_t T = 24, B = 4;
  for (const bool reset : {false, true}) {
    cleave::BatchLoader loader(shard, T, 5, 0, {true, reset, 3});
    cleave::Batch b;
    loader.fill(b, 2, 0, B);
    ASSERT_EQ(b.documents.size(), size_t(B * T));
    EXPECT_EQ(b.valid_tokens, B * T);
    for (int64_t r = 0; r < B; ++r) {
      int32_t document = 0, start = 0;
      for (int64_t t = 0; t < T; ++t) {
        const size_t i = size_t(r * T + t);
        EXPECT_EQ(b.documents[i], document) << "row " << r << " token " << t;
        EXPECT_EQ(b.positions[i], reset ? int32_t(t) - start : int32_t(t)) << "row " << r;
        if (b.tokens[i] == 3) ++document, start = int32_t(t) + 1;
      }
      EXPECT_GE(document, 3) << "a window of 24 tokens holds at least 3 separators";
    }
  }
  // Without document options: one document, positions 0 .. T-1.
  cleave::BatchLoader plain(shard, T, 5, 0);
  cleave::Batch b;
  plain.fill(b, 2, 0, B);
  EXPECT_TRUE(b.documents.empty());
  for (int64_t i = 0; i < B * T; ++i) EXPECT_EQ(b.positions[size_t(i)], int32_t(i % T));
}

// Context parallelism's deal: cp rank r holds chunks r and 2cp-1-r of each window (T / (2 cp)
// tokens each), with the whole window's positions, documents and targets there, and every rank
// has the whole windows' documents; together the ranks hold every token once.
TEST_F(LoaderTest, ContextSplitDealsZigzagChunks) {
  const std::string p = make_shard("docs.bin", 3000, 7);
  cleave::TokenShard shard(p, 7);
  const int64_t T = 24, B = 3;
  cleave::BatchLoader whole_loader(shard, T, 5, 0, {true, true, 3});
  cleave::Batch whole;
  whole_loader.fill(whole, 4, 1, B);
  for (const int cp : {2, 3}) {
    const int64_t c = T / (2 * cp);
    std::vector<int> seen(size_t(B * T), 0);
    for (int r = 0; r < cp; ++r) {
      cleave::BatchLoader loader(shard, T, 5, 0, {true, true, 3}, {cp, r});
      cleave::Batch b;
      loader.fill(b, 4, 1, B);
      ASSERT_EQ(b.T, 2 * c);
      ASSERT_EQ(b.B, B);
      EXPECT_EQ(b.valid_tokens, B * 2 * c);
      EXPECT_EQ(b.sequence_documents, whole.documents);
      for (int64_t s = 0; s < B; ++s)
        for (int h = 0; h < 2; ++h)
          for (int64_t t = 0; t < c; ++t) {
            const int64_t chunk = h == 0 ? r : 2 * cp - 1 - r;
            const size_t i = size_t(s * 2 * c + h * c + t), j = size_t(s * T + chunk * c + t);
            EXPECT_EQ(b.tokens[i], whole.tokens[j]) << "cp " << cp << " rank " << r;
            EXPECT_EQ(b.targets[i], whole.targets[j]);
            EXPECT_EQ(b.positions[i], whole.positions[j]);
            EXPECT_EQ(b.documents[i], whole.documents[j]);
            ++seen[j];
          }
    }
    for (int n : seen) EXPECT_EQ(n, 1) << "cp " << cp;
  }
  try {
    cleave::BatchLoader bad(shard, 20, 5, 0, {}, {3, 0});
    FAIL() << "a window of 20 tokens was cut into 6 chunks";
  } catch (const cleave::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.seq_len = 20 cannot be cut into 2 x parallel.cp = 6"),
              std::string::npos) << e.what();
  }
}
