// main() of the multi-rank tests (tests/mpi/*_test.cpp, run under mpirun): MPI with
// MPI_THREAD_MULTIPLE, the comm engine, the world group, then the tests. Rank 0 prints the usual
// gtest output; other ranks print only their failures. Returns non-zero if a test failed on this
// rank (mpirun then fails the job).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "comm_test_util.h"

namespace cleave::test {
Group* g_world = nullptr;
}

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { cleave::test::g_world = new cleave::Group(MPI_COMM_WORLD, "world"); }
  void TearDown() override {
    delete cleave::test::g_world;
    cleave::test::g_world = nullptr;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  cleave::CommOptions options;
  options.timeout_seconds = 30;  // a hang fails the test run in 30 s, with a report
  cleave::init_comm(options);
  ::testing::AddGlobalTestEnvironment(new WorldEnvironment);
  const int rc = RUN_ALL_TESTS();
  cleave::shutdown_comm();
  MPI_Finalize();
  return rc;
}
