// FP8 "current" scales over tp shards (model/fp8_amax.h), the world as the tp group: a
// row-parallel product (x and W split along the inner dimension) and a column-parallel
// backward_input (dy and W split along the outputs) give, summed over the ranks, what one process
// gives on the whole tensors, because every rank quantises its shard with the whole tensor's
// scale. Without the reduction each shard takes its own scale and the sum is another one (the
// check that this test can fail). Run with 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comm_test_util.h"
#include "cleave/kernels/linear.h"
#include "cleave/model/fp8_amax.h"
#include "cleave/parallel/tensor_parallel.h"

namespace cleave {
namespace {

constexpr int64_t kRows = 5;
constexpr int kOut = 7, kInPerRank = 12;

// Element (i, j) of a whole tensor; columns of higher ranks' shards are larger, so that the
// shards' own amaxes differ by factors that are not powers of two (a power-of-two ratio of scales
// changes no code but the subnormals).
float element(int64_t i, int64_t j, int per_rank) {
  return float(std::sin(0.37 * double(i * 131 + j)) * (1.0 + 0.37 * double(j / per_rank)));
}

std::vector<float> whole(int64_t rows, int64_t cols, int per_rank, float scale) {
  std::vector<float> v(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[size_t(i * cols + j)] = scale * element(i, j, per_rank);
  return v;
}

std::vector<float> columns(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t c0,
                           int64_t n) {
  std::vector<float> out(size_t(rows * n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) out[size_t(i * n + j)] = v[size_t(i * cols + c0 + j)];
  return out;
}

// The largest relative difference of the ranks' summed partial products from one process's.
float sum_error(GroupTpComm& comm, std::vector<float> partial, const std::vector<float>& want) {
  comm.all_reduce(partial.data(), int64_t(partial.size()))();
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(partial[i] - want[i]) / (std::fabs(want[i]) + 1e-3f));
  return worst;
}

TEST(Fp8CurrentScales, ShardsTakeTheWholeTensorsScale) {
  GroupTpComm comm{test::world()};
  const int p = comm.size(), r = comm.rank();
  const int in = kInPerRank * p;
  // Row-parallel forward: x [rows, in] and W [out, in] split along in.
  const auto x = whole(kRows, in, kInPerRank, 1.0f), w = whole(kOut, in, kInPerRank, 0.05f);
  LinearGemm one(in, kOut, Precision::fp8);
  one.set_fp8({kernels::Fp8Recipe::current, 0, nullptr, nullptr});
  one.set_weight(w.data());
  std::vector<float> y(kRows * kOut);
  one.forward(y.data(), x.data(), kRows, nullptr);

  // Column-parallel backward_input: dy [rows, out * p] and W2 [out * p, in] split along out.
  const int out2 = kOut * p;
  const auto dy = whole(kRows, out2, kOut, 1e-3f), w2 = whole(out2, in, in, 0.05f);
  LinearGemm one2(in, out2, Precision::fp8);
  one2.set_fp8({kernels::Fp8Recipe::current, 0, nullptr, nullptr});
  one2.set_weight(w2.data());
  std::vector<float> dx(kRows * in);
  one2.backward_input(dx.data(), dy.data(), kRows, false);

  const auto x_mine = columns(x, kRows, in, r * kInPerRank, kInPerRank);
  const auto w_mine = columns(w, kOut, in, r * kInPerRank, kInPerRank);
  const auto dy_mine = columns(dy, kRows, out2, r * kOut, kOut);
  const std::vector<float> w2_mine(w2.begin() + int64_t(r) * kOut * in,
                                   w2.begin() + int64_t(r + 1) * kOut * in);
  GroupAmax amax(&comm, nullptr);
  for (bool reduced : {true, false}) {
    AmaxReducer* reducer = reduced ? &amax : nullptr;
    LinearGemm shard(kInPerRank, kOut, Precision::fp8);
    shard.set_fp8({kernels::Fp8Recipe::current, 0, reducer, reducer});
    shard.set_weight(w_mine.data());
    std::vector<float> y_part(kRows * kOut);
    shard.forward(y_part.data(), x_mine.data(), kRows, nullptr);
    LinearGemm shard2(in, kOut, Precision::fp8);
    shard2.set_fp8({kernels::Fp8Recipe::current, 0, reducer, reducer});
    shard2.set_weight(w2_mine.data());
    std::vector<float> dx_part(kRows * in);
    shard2.backward_input(dx_part.data(), dy_mine.data(), kRows, false);
    const float forward_error = sum_error(comm, y_part, y);
    const float backward_error = sum_error(comm, dx_part, dx);
    if (reduced) {
      EXPECT_LT(forward_error, 1e-5f) << "row-parallel forward";
      EXPECT_LT(backward_error, 1e-5f) << "column-parallel backward_input";
    } else {
      EXPECT_GT(forward_error, 1e-3f) << "shards' own scales should give another product";
      EXPECT_GT(backward_error, 1e-3f) << "shards' own scales should give another product";
    }
  }
}

}  // namespace
}  // namespace cleave
