// How the errors of several ranks read as one report (agree_on_errors), without MPI.
#include <gtest/gtest.h>

#include "cleave/comm/errors.h"

namespace cleave {
namespace {

TEST(CommErrors, AnErrorOfEveryRankIsReportedAsItIs) {
  EXPECT_EQ(describe_rank_errors({"bad key", "bad key", "bad key"}), "bad key");
  EXPECT_EQ(describe_rank_errors({"bad key"}), "bad key");
}

TEST(CommErrors, EachDistinctMessageOnceNamingItsRanks) {
  EXPECT_EQ(describe_rank_errors({"", "no file", "", "no file"}), "ranks 1, 3: no file");
  EXPECT_EQ(describe_rank_errors({"x", "x", "y", ""}), "ranks 0-1: x\nrank 2: y");
  EXPECT_EQ(describe_rank_errors({"b", "a", "a", "a", "b", "a"}), "ranks 0, 4: b\nranks 1-3, 5: a");
}

TEST(CommErrors, NoErrorNoText) { EXPECT_EQ(describe_rank_errors({"", ""}), ""); }

}  // namespace
}  // namespace cleave
