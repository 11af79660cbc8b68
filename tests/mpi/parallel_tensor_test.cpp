// The vocabulary-parallel loss over the world as the tp group: with each rank's columns of one set
// of logits it matches the single-process cross-entropy (losses and each rank's columns of the
// gradient); composed on gathered logits (every rank holding them all) it counts every column tp
// times, and the placement check mode stops it with an error that names the module and what it
// expected. Run with 2, 3 and 4 ranks; 37 columns leave the last rank padding at every size.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm_test_util.h"
#include "cleave/kernels/cross_entropy.h"
#include "cleave/parallel/tensor_parallel.h"

namespace cleave {
namespace {

constexpr int64_t kRows = 6;
constexpr int kVocab = 37;

float logit(int64_t row, int64_t col) { return float(std::sin(0.7 * double(row * kVocab + col)) * 3.0); }

struct Fixture {
  GroupTpComm comm{test::world()};
  ModelConfig model;
  std::vector<int32_t> targets;
  std::vector<float> stats, all_stats, losses;
  Fixture() {
    model.vocab_size = kVocab;
    model.n_heads = model.n_kv_heads = 12;  // divisible by 2, 3 and 4
    model.ffn_hidden = 12;
    for (int64_t i = 0; i < kRows; ++i) targets.push_back(int32_t((i * 11) % kVocab));
    stats.resize(3 * kRows);
    all_stats.resize(3 * kRows * size_t(comm.size()));
    losses.resize(kRows);
  }
};

TEST(VocabParallelLoss, ShardsMatchTheWholeVocabulary) {
  Fixture f;
  const TpShare share = tp_share(f.model, f.comm.size(), f.comm.rank());
  std::vector<float> whole(kRows * kVocab), mine(kRows * share.vocab_rows, 99.0f), ref(kRows);
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t j = 0; j < kVocab; ++j) whole[i * kVocab + j] = logit(i, j);
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t j = 0; j < share.vocab_real; ++j)
      mine[i * share.vocab_rows + j] = logit(i, share.vocab_begin + j);
  kernels::cross_entropy_forward_backward(whole.data(), ref.data(), f.targets.data(), kRows, kVocab,
                                          0.5f);
  const TensorParallelOptions tp{&f.comm, false, true};
  vocab_parallel_cross_entropy(tp, share, kVocab, mine.data(), f.losses.data(), f.targets.data(),
                               kRows, 0.5f, f.stats.data(), f.all_stats.data());
  for (int64_t i = 0; i < kRows; ++i) {
    EXPECT_NEAR(f.losses[i], ref[i], 1e-5f * std::abs(ref[i])) << "row " << i;
    for (int64_t j = 0; j < share.vocab_rows; ++j) {
      const float want = j < share.vocab_real ? whole[i * kVocab + share.vocab_begin + j] : 0.0f;
      EXPECT_NEAR(mine[i * share.vocab_rows + j], want, 1e-6f) << "row " << i << " column " << j;
    }
  }
}

TEST(VocabParallelLoss, GatheredLogitsFailThePlacementCheck) {
  Fixture f;
  // Every rank passes all the columns, as if the logits had been gathered first.
  TpShare gathered = tp_share(f.model, f.comm.size(), f.comm.rank());
  gathered.vocab_rows = gathered.vocab_real = kVocab;
  gathered.vocab_begin = 0;
  std::vector<float> logits(kRows * kVocab), ref(kRows);
  auto fill = [&] {
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t j = 0; j < kVocab; ++j) logits[i * kVocab + j] = logit(i, j);
  };
  fill();
  kernels::cross_entropy_forward_backward(logits.data(), ref.data(), f.targets.data(), kRows,
                                          kVocab, 0.0f);
  // Unchecked, the composition is silently wrong: every column counts tp times, in the sum-exp
  // (log(tp) on the loss, Megatron's old bug) and in the target logit.
  fill();
  vocab_parallel_cross_entropy({&f.comm, false, false}, gathered, kVocab, logits.data(),
                               f.losses.data(), f.targets.data(), kRows, 0.0f, f.stats.data(),
                               f.all_stats.data());
  for (int64_t i = 0; i < kRows; ++i)
    EXPECT_NEAR(f.losses[i] - ref[i],
                std::log(double(f.comm.size())) - (f.comm.size() - 1) * logit(i, f.targets[i]),
                1e-4)
        << "row " << i;
  fill();
  try {
    vocab_parallel_cross_entropy({&f.comm, false, true}, gathered, kVocab, logits.data(),
                                 f.losses.data(), f.targets.data(), kRows, 0.0f, f.stats.data(),
                                 f.all_stats.data());
    FAIL() << "gathered logits passed the placement check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("placement check: vocab-parallel cross-entropy: its "
                                         "logits are Replicate on tp"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("expects Shard(vocab)"), std::string::npos) << e.what();
  }
}

TEST(PlacementCheck, NamesTheTensorThatIsNotReplicated) {
  GroupTpComm comm(test::world());
  std::vector<float> same(16, 1.5f), differs(16, float(comm.rank()));
  comm.check_replicated(same.data(), 16, "blocks.0.attn.qkv input (Replicate on tp)");
  try {
    comm.check_replicated(differs.data(), 16, "blocks.0.attn.qkv input (Replicate on tp)");
    FAIL() << "per-rank values passed as replicated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("placement check: blocks.0.attn.qkv input (Replicate on "
                                         "tp): tp rank 1 holds other values than tp rank 0"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cleave
