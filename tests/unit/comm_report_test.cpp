// The timeout/SIGTERM report pieces without MPI: SafeText formatting, the flight recorder's ring,
// and the status board's analysis of which rank is behind (two boards play two ranks; a third,
// on another host, is unknown).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <optional>

#include "cleave/comm/flight_recorder.h"
#include "cleave/comm/status.h"

namespace cleave::comm_detail {
namespace {

std::string format(void (*f)(SafeText&)) {
  std::string s;
  {
    SafeText out(SafeText::string_sink, &s);
    f(out);
  }
  return s;
}

TEST(CommReport, SafeTextFormatsNumbers) {
  EXPECT_EQ(format([](SafeText& o) { o.num(0).chr(' ').num(-42).chr(' ').unum(18446744073709551615ull); }),
            "0 -42 18446744073709551615");
  EXPECT_EQ(format([](SafeText& o) { o.fixed(1.5, 3).chr(' ').fixed(-0.25, 1).chr(' ').fixed(2, 0); }),
            "1.500 -0.3 2");
  EXPECT_EQ(format([](SafeText& o) { o.bytes(512).chr(',').bytes(4096).chr(',').bytes(1536 * 1024); }),
            "512 B,4 KiB,1.5 MiB");
  // More than the internal buffer: flushed in pieces, nothing lost.
  std::string big = format([](SafeText& o) {
    for (int i = 0; i < 10000; ++i) o.str("abcdefgh");
  });
  EXPECT_EQ(big.size(), 80000u);
}

std::unique_ptr<WorkState> op(Op o, const char* group, int slot, uint64_t seq, int64_t bytes) {
  auto p = std::make_unique<WorkState>();
  WorkState& w = *p;
  w.op = o;
  w.kind = op_kind(o);
  w.group = group;
  w.slot = slot;
  w.seq = seq;
  w.bytes = bytes;
  w.algo = CommAlgo::ours;
  w.started_wall = wall_seconds();
  return p;
}

TEST(CommReport, FlightRecorderKeepsTheLastN) {
  FlightRecorder fr(3, 0, wall_seconds());
  uint64_t ids[5];
  for (int i = 0; i < 5; ++i) {
    ids[i] = fr.add(*op(Op::all_reduce, "dp", 0, uint64_t(i + 1), 1024), wall_seconds());
  }
  fr.started(ids[4], wall_seconds());
  fr.started(ids[3], wall_seconds());
  fr.ended(ids[3], wall_seconds(), false);
  fr.ended(ids[0], wall_seconds(), false);  // long overwritten: ignored
  const std::string r = fr.report();
  EXPECT_NE(r.find("last 3 of 5"), std::string::npos) << r;
  EXPECT_EQ(r.find("#2 "), std::string::npos) << r;
  EXPECT_NE(r.find("#3 "), std::string::npos) << r;
  EXPECT_NE(r.find("QUEUED"), std::string::npos) << r;   // #3
  EXPECT_NE(r.find(" ms"), std::string::npos) << r;      // #4 finished
  EXPECT_NE(r.find("RUNNING"), std::string::npos) << r;  // #5
}

TEST(CommReport, StatusNamesTheRankThatIsBehind) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("cleave-comm-report-test-" + std::to_string(getpid()));
  {
    StatusBoard r0(dir, 0, 3), r1(dir, 1, 3);  // rank 2 never starts: missing
    const std::vector<int> members = {0, 1, 2};
    const int s0 = r0.add_group("world", members, 0), s1 = r1.add_group("world", members, 1);
    for (uint64_t seq = 1; seq <= 5; ++seq) {
      auto a = op(Op::all_reduce, "world", s0, seq, 4096), b = op(Op::all_reduce, "world", s1, seq, 4096);
      r0.started(*a);
      r0.completed(*a);
      r1.started(*b);
      r1.completed(*b);
    }
    r0.started(*op(Op::all_reduce, "world", s0, 6, 4096));
    std::string report;
    {
      SafeText out(SafeText::string_sink, &report);
      r0.write_report(out, s0, 6, Op::all_reduce);
    }
    EXPECT_NE(report.find("group \"world\" (3 ranks) at collective #6 all_reduce"), std::string::npos) << report;
    EXPECT_NE(report.find("waiting in it:           rank 0\n"), std::string::npos) << report;
    EXPECT_NE(report.find("BEHIND (not started it): rank 1 (at #5 all_reduce"), std::string::npos) << report;
    // Nothing more about rank 2: there is nothing to read (not the page of the rank read before).
    EXPECT_NE(report.find("MISSING (no status):     rank 2\n"), std::string::npos) << report;
    EXPECT_NE(report.find("rank 2: no status file"), std::string::npos) << report;

    // A rank that started another op under the same number is reported as a mismatch.
    r1.started(*op(Op::broadcast, "world", s1, 6, 4096));
    report.clear();
    {
      SafeText out(SafeText::string_sink, &report);
      r0.write_report(out, s0, 6, Op::all_reduce);
    }
    EXPECT_NE(report.find("MISMATCH (another op):   rank 1 (at #6 broadcast"), std::string::npos) << report;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));  // the last board to go removes the folder
}

// A rank on another host whose status file is not in this host's folder (a status folder per host,
// the default) is unknown: the report must neither call it dead or missing nor guess its progress.
TEST(CommReport, RankOnAnotherHostWithoutStatusIsUnknown) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("cleave-comm-report-hosts-" + std::to_string(getpid()));
  char me[64] = {};
  gethostname(me, sizeof(me) - 1);
  const std::vector<std::string> hosts = {me, me, "far-away-host"};
  {
    StatusBoard r0(dir, 0, 3, hosts), r1(dir, 1, 3, hosts);
    const std::vector<int> members = {0, 1, 2};
    const int s0 = r0.add_group("world", members, 0), s1 = r1.add_group("world", members, 1);
    auto a = op(Op::all_reduce, "world", s0, 1, 4096), b = op(Op::all_reduce, "world", s1, 1, 4096);
    r0.started(*a);
    r1.started(*b);
    for (int focus : {s0, -1}) {  // the timeout report, then the SIGTERM one (no focus)
      std::string report;
      {
        SafeText out(SafeText::string_sink, &report);
        r0.write_report(out, focus, focus < 0 ? 0 : 1, focus < 0 ? Op::barrier : Op::all_reduce);
      }
      EXPECT_NE(report.find("rank 2: on far-away-host, status UNKNOWN: no status file in " + dir +
                            " as seen from " + me + " (not shared between hosts? set "
                            "parallel.status_dir to a folder every host shares)"),
                std::string::npos) << report;
      EXPECT_NE(report.find("waiting in it:           rank 0, rank 1\n"), std::string::npos) << report;
      EXPECT_NE(report.find("UNKNOWN (other host):    rank 2 (on far-away-host, status not visible here)"),
                std::string::npos) << report;
      for (const char* wrong : {"DEAD", "MISSING", "BEHIND", "not started yet"})
        EXPECT_EQ(report.find(wrong), std::string::npos) << wrong << " in\n" << report;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// The reporting rank times out in a group within its host, behind a rank of its host that waits in
// a group crossing to another host: the analysis follows that rank into the group it waits in
// (which the reporting rank is not in) and finds its members there by their status pages.
TEST(CommReport, FollowsABehindRankIntoTheGroupItWaitsIn) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("cleave-comm-report-chain-" + std::to_string(getpid()));
  char me[64] = {};
  gethostname(me, sizeof(me) - 1);
  const std::vector<std::string> hosts = {me, me, "far-away-host", "far-away-host"};
  {
    StatusBoard r0(dir, 0, 4, hosts), r1(dir, 1, 4, hosts);
    const std::vector<int> shard = {0, 1}, replicate = {1, 3};
    const int a0 = r0.add_group("dp_shard", shard, 0), a1 = r1.add_group("dp_shard", shard, 1);
    const int b1 = r1.add_group("dp_replicate", replicate, 0);
    auto first0 = op(Op::reduce_scatter, "dp_shard", a0, 1, 4096);
    auto first1 = op(Op::reduce_scatter, "dp_shard", a1, 1, 4096);
    r0.started(*first0);
    r0.completed(*first0);
    r1.started(*first1);
    r1.completed(*first1);
    r0.started(*op(Op::reduce_scatter, "dp_shard", a0, 2, 4096));
    r1.started(*op(Op::all_reduce, "dp_replicate", b1, 5, 8192));
    std::string report;
    {
      SafeText out(SafeText::string_sink, &report);
      r0.write_report(out, a0, 2, Op::reduce_scatter);
    }
    EXPECT_NE(report.find("BEHIND (not started it): rank 1 (at #1 reduce_scatter"), std::string::npos)
        << report;
    const size_t chain = report.find(
        "cleave comm: rank 1, behind, waits in group \"dp_replicate\" (2 ranks) at collective #5 "
        "all_reduce:\n    waiting in it:           rank 1\n"
        "    UNKNOWN (other host):    rank 2 (on far-away-host, status not visible here), rank 3 ");
    EXPECT_NE(chain, std::string::npos) << report;
    EXPECT_NE(report.find("    (1 member(s) among those 2 ranks without a status here)\n", chain),
              std::string::npos) << report;
    // Rank 0 is not in dp_replicate: it must not be listed there.
    EXPECT_EQ(report.find("rank 0", chain), std::string::npos) << report;
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A rank that failed with an error is seen as such by the others (their SIGTERM handlers then stay
// quiet), and its file stays until the last rank leaves, which removes the whole folder.
TEST(CommReport, FailedRankIsSeenAndTheLastToLeaveRemovesTheFolder) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("cleave-comm-report-failed-" + std::to_string(getpid()));
  std::optional<StatusBoard> r0, r1, r2;
  r0.emplace(dir, 0, 3);
  r1.emplace(dir, 1, 3);
  r2.emplace(dir, 2, 3);
  EXPECT_EQ(r0->failed_rank(), -1);
  r2->set_state(RankState::failed);
  r2->leave();
  EXPECT_EQ(r0->failed_rank(), 2);
  EXPECT_EQ(r1->failed_rank(), 2);
  r1->leave();
  EXPECT_TRUE(std::filesystem::exists(dir + "/rank-2.status"));  // rank 0 may still read it
  r0->leave();
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// A rank held by SIGSTOP (or a debugger) inside a collective is no more "waiting in it": the report
// names it as stopped, in the group's analysis and in its status line.
TEST(CommReport, StoppedRankIsNamed) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("cleave-comm-report-stopped-" + std::to_string(getpid()));
  const std::vector<int> members = {0, 1};
  StatusBoard r0(dir, 0, 2);
  const int s0 = r0.add_group("pp", members, 0);
  const pid_t child = fork();
  if (child == 0) {
    StatusBoard r1(dir, 1, 2);
    r1.started(*op(Op::all_reduce, "pp", r1.add_group("pp", members, 1), 1, 4096));
    raise(SIGSTOP);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  r0.started(*op(Op::all_reduce, "pp", s0, 1, 4096));
  std::string report;
  {
    SafeText out(SafeText::string_sink, &report);
    r0.write_report(out, s0, 1, Op::all_reduce);
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  EXPECT_NE(report.find("waiting in it:           rank 0\n"), std::string::npos) << report;
  EXPECT_NE(report.find("STOPPED (not running):   rank 1 (at #1 all_reduce, not completed)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("running, STOPPED (a signal or a debugger holds the process)"),
            std::string::npos) << report;
}

TEST(CommReport, AJobStartRemovesTheFoldersOfKilledJobsOnly) {
  const std::filesystem::path parent = std::filesystem::temp_directory_path() /
                                       ("cleave-comm-report-sweep-" + std::to_string(getpid()));
  const std::string killed = parent / "cleave-killed", running = parent / "cleave-running",
                    stopped = parent / "cleave-stopped";
  // A job whose only rank was killed outright: its file stays, its process is gone.
  const pid_t child = fork();
  if (child == 0) {
    new StatusBoard(killed, 0, 1);  // never destroyed, as under SIGKILL
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(std::filesystem::exists(killed + "/rank-0.status"));
  // A job whose rank is stopped (as strace holds one in a system call): alive, its folder stays.
  const pid_t held = fork();
  if (held == 0) {
    new StatusBoard(stopped, 0, 1);
    raise(SIGSTOP);
    _exit(0);
  }
  ASSERT_EQ(waitpid(held, &status, WUNTRACED), held);
  ASSERT_TRUE(WIFSTOPPED(status));
  {
    StatusBoard alive(running, 0, 1);  // a job still running beside
    StatusBoard starting((parent / "cleave-new").string(), 0, 1);
    EXPECT_FALSE(std::filesystem::exists(killed));
    EXPECT_TRUE(std::filesystem::exists(running + "/rank-0.status"));
    EXPECT_TRUE(std::filesystem::exists(stopped + "/rank-0.status"));
  }
  kill(held, SIGKILL);
  waitpid(held, &status, 0);
  std::filesystem::remove_all(stopped);
  EXPECT_TRUE(std::filesystem::is_empty(parent));
  std::filesystem::remove_all(parent);
}

}  // namespace
}  // namespace cleave::comm_detail
