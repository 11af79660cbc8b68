// What the communication engine's scratch holds for a reduction (reduction_scratch_bytes, which the
// planner counts): cleave's ring stages the partial sums it receives in 1 MiB chunks up to its
// window of 8; a bf16 ring or a reduce_scatter of more than 2 ranks also keeps two fp32 blocks of
// partial sums; MPI's collectives keep theirs inside MPI.
#include <gtest/gtest.h>

#include "cleave/comm/group.h"

namespace cleave {
namespace {

constexpr int64_t kChunk = 256 * 1024;  // floats
constexpr int64_t MiB = 1 << 20;

TEST(CommScratch, TheRingStagesWhatItReceivesUpToItsWindow) {
  // 2 ranks: an all_reduce receives one block, half the buffer, in chunks.
  EXPECT_EQ(reduction_scratch_bytes(false, 4 * kChunk, CommType::f32, 2, CommAlgo::ours), 2 * MiB);
  EXPECT_EQ(reduction_scratch_bytes(false, 3 * kChunk, CommType::f32, 2, CommAlgo::ours), 2 * MiB);
  EXPECT_EQ(reduction_scratch_bytes(false, 64 * kChunk, CommType::f32, 2, CommAlgo::ours), 8 * MiB);
  // 4 ranks: 3 reduce steps of a block each; a reduce_scatter keeps two blocks of partial sums.
  EXPECT_EQ(reduction_scratch_bytes(false, 8 * kChunk, CommType::f32, 4, CommAlgo::ours), 6 * MiB);
  EXPECT_EQ(reduction_scratch_bytes(true, kChunk, CommType::f32, 4, CommAlgo::ours),
            3 * MiB + 2 * MiB);
  EXPECT_EQ(reduction_scratch_bytes(false, 8 * kChunk, CommType::bf16, 4, CommAlgo::ours),
            6 * MiB + 2 * 2 * kChunk * 4);
  // Nothing for MPI's, one rank, or nothing to send; fastest picks ours for 2 ranks.
  EXPECT_EQ(reduction_scratch_bytes(false, 8 * kChunk, CommType::f32, 2, CommAlgo::mpi), 0);
  EXPECT_EQ(reduction_scratch_bytes(false, 8 * kChunk, CommType::f32, 1, CommAlgo::ours), 0);
  EXPECT_EQ(reduction_scratch_bytes(true, 0, CommType::f32, 2, CommAlgo::ours), 0);
  EXPECT_EQ(reduction_scratch_bytes(false, 4 * kChunk, CommType::f32, 2), 2 * MiB);
}

}  // namespace
}  // namespace cleave
