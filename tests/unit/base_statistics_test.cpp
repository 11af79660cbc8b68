#include "cleave/base/statistics.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

TEST(Statistics, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({5, 1, 3}), 3);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
}

TEST(Statistics, QuantileIsTheElementAtTheRankRoundedDown) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  EXPECT_EQ(quantile(v, 0.0), 1);
  EXPECT_EQ(quantile(v, 0.5), 50);   // rank 0.5 * 99 = 49.5, below: the 50th value
  EXPECT_EQ(quantile(v, 0.99), 99);  // 98.01 -> the 99th
  EXPECT_EQ(quantile(v, 1.0), 100);
  EXPECT_EQ(quantile(v, 2.0), 100);  // clamped
  EXPECT_EQ(quantile({}, 0.5), 0);
}

}  // namespace
}  // namespace cleave
