// Pipeline schedules as data: action text, every generator over a grid of (pp, micro-batches,
// chunks) through the checker, CSV round trips, hand-broken CSVs and their messages, and the
// simulated makespans the zero-bubble and interleaved schedules exist for.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {
namespace {

// text holds part (an assertion of gtest's own, so a failure prints both).
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}
namespace fs = std::filesystem;

const ActionType kAllTypes[] = {
    ActionType::forward,       ActionType::backward,      ActionType::backward_input,
    ActionType::backward_weight, ActionType::send_forward, ActionType::recv_forward,
    ActionType::send_backward, ActionType::recv_backward,
};

// A folder of its own per test process, removed at the end.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("cleave_pipeline_" + std::to_string(getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, const std::string& content = "") const {
    const std::string p = (path_ / name).string();
    if (!content.empty()) std::ofstream(p) << content;
    return p;
  }

 private:
  fs::path path_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string check_error(const Schedule& s) {
  return error_of([&] { check_schedule(s); });
}

// A rank's forward of one micro-batch through all its layers costs F = I = W = 1: a stage of a
// schedule with v chunks per rank costs 1/v, so makespans compare across schedules.
double unit_makespan(const Schedule& s) {
  const double v = check_schedule(s).stages.chunks_per_rank;
  return check_schedule(s, ActionCosts{1 / v, 1 / v, 1 / v}).makespan;
}

TEST(PipelineAction, TextRoundTripsEveryType) {
  for (ActionType t : kAllTypes)
    for (auto [stage, mb] : {std::pair{0, 0}, {3, 17}, {123, 4567}}) {
      Action a;
      a.type = t, a.stage = stage, a.mb = mb;
      EXPECT_EQ(parse_action(to_string(a)), a) << to_string(a);
    }
  EXPECT_EQ(to_string(parse_action("0F3")), "0F3");
  EXPECT_EQ(parse_action("2I0").type, ActionType::backward_input);
  EXPECT_EQ(parse_action("1SEND_F2"), (Action{ActionType::send_forward, 1, 2}));
  EXPECT_EQ(parse_action("3RECV_B1"), (Action{ActionType::recv_backward, 3, 1}));
  EXPECT_EQ(parse_action("0W9"), (Action{ActionType::backward_weight, 0, 9}));
}

TEST(PipelineAction, BadTextIsAnError) {
  for (const std::string bad : {"", "F3", "0F", "0X3", "-1F2", "0f3", "0SEND3", "0F3x", " 0F3",
                                "0SEND_F", "1234567890F1", "0FB1"}) {
    const std::string e = error_of([&] { parse_action(bad); });
    EXPECT_TRUE(Contains(e, "not a pipeline action: '" + bad + "'")) << bad;
  }
}

// Whether generate_schedule must accept (name, pp, m, v).
bool valid(const std::string& name, int pp, int m, int v) {
  if (name == "interleaved") return v >= 2 && m % pp == 0;
  if (name == "zbv") return v == 2 && m >= 2 * pp - 1;
  return v == 1;
}

TEST(PipelineGenerators, EveryScheduleOnAGridPassesTheChecker) {
  for (int pp : {1, 2, 3, 4, 8})
    for (int m = 1; m <= 16; ++m)
      for (auto [name, v] : {std::pair<std::string, int>{"gpipe", 1}, {"1f1b", 1}, {"zb1p", 1},
                             {"interleaved", 2}, {"interleaved", 3}, {"zbv", 2}}) {
        SCOPED_TRACE(name + " pp " + std::to_string(pp) + " m " + std::to_string(m) + " v " +
                     std::to_string(v));
        if (!valid(name, pp, m, v)) {
          EXPECT_THROW(generate_schedule(name, pp, m, v), Error);
          continue;
        }
        const Schedule s = generate_schedule(name, pp, m, v);
        ASSERT_EQ(s.pp, pp);
        ASSERT_EQ(s.microbatches, m);
        ASSERT_EQ(s.n_stages, pp * v);
        ScheduleCheck c;
        ASSERT_NO_THROW(c = check_schedule(s)) << check_error(s);
        const StageMap expect = name == "zbv" ? v_stages(pp) : looped_stages(pp, v);
        EXPECT_EQ(c.stages.rank_of_stage, expect.rank_of_stage);
        EXPECT_EQ(c.stages.chunk_of_stage, expect.chunk_of_stage);
        EXPECT_EQ(c.stages.chunks_per_rank, v);

        // Each (stage, mb): one F, and one B or one I and one W.
        std::map<std::tuple<int, int, ActionType>, int> count;
        for (const auto& rank : s.ranks)
          for (const Action& a : rank) ++count[{a.stage, a.mb, a.type}];
        for (int st = 0; st < s.n_stages; ++st)
          for (int mb = 0; mb < m; ++mb) {
            EXPECT_EQ((count[{st, mb, ActionType::forward}]), 1);
            const int b = count[{st, mb, ActionType::backward}];
            const int i = count[{st, mb, ActionType::backward_input}];
            const int w = count[{st, mb, ActionType::backward_weight}];
            EXPECT_TRUE((b == 1 && i == 0 && w == 0) || (b == 0 && i == 1 && w == 1));
          }

        if (name == "gpipe") {
          EXPECT_EQ(c.max_in_flight[0][0], m);
        }
        if (name == "1f1b" || name == "zb1p") {
          for (int r = 0; r < pp; ++r) EXPECT_LE(c.max_in_flight[r][0], pp) << "rank " << r;
          EXPECT_EQ(c.max_in_flight[0][0], std::min(pp, m));
        }
        if (name == "1f1b") {
          for (int r = 0; r < pp; ++r) EXPECT_EQ(c.max_in_flight[r][0], std::min(pp - r, m));
        }
      }
}

TEST(PipelineGenerators, SendsFollowTheirComputeAndReceivesComeEarly) {
  const Schedule s = generate_schedule("1f1b", 2, 2, 1);
  auto text = [](const std::vector<Action>& l) {
    std::string t;
    for (const Action& a : l) {
      if (!t.empty()) t += ',';
      t += to_string(a);
    }
    return t;
  };
  EXPECT_EQ(text(s.ranks[0]), "0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0RECV_B1,0B0,0B1");
  EXPECT_EQ(text(s.ranks[1]), "1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1");
}

TEST(PipelineGenerators, ErrorsNameTheNumbers) {
  struct Bad {
    const char* name;
    int pp, microbatches, virtual_chunks;
    const char* message;
  };
  const Bad bad[] = {
      {"pipedream", 2, 4, 1,
       "unknown pipeline schedule 'pipedream' (known: gpipe, 1f1b, interleaved, zb1p, zbv)"},
      {"interleaved", 2, 3, 2, "interleaved needs microbatches (3) to be a multiple of pp (2)"},
      {"interleaved", 2, 4, 1, "interleaved needs virtual chunks >= 2 per rank (got 1)"},
      {"zbv", 4, 6, 2, "zbv needs microbatches (6) >= 2 x pp - 1 (7)"},
      {"zbv", 4, 8, 3, "virtual chunks must be 2 (got 3)"},
      {"1f1b", 4, 8, 2, "1f1b runs one chunk per rank: virtual chunks must be 1 (got 2)"},
      {"gpipe", 0, 8, 1, "(got pp 0, microbatches 8)"},
  };
  for (const Bad& b : bad)
    EXPECT_TRUE(Contains(error_of([&] {
                           generate_schedule(b.name, b.pp, b.microbatches, b.virtual_chunks);
                         }),
                         b.message));
}

TEST(PipelineCheck, SimulatedTimesOf1F1B) {
  // pp 2, one micro-batch: F on rank 0, F on rank 1, B on rank 1 (2 units), B on rank 0.
  const ScheduleCheck c = check_schedule(generate_schedule("1f1b", 2, 1, 1));
  EXPECT_EQ(c.makespan, 6);
  EXPECT_EQ(c.start[1][1], 1);  // 1F0, after 1RECV_F0
  EXPECT_EQ(c.end[1][2], 4);    // 1B0
  EXPECT_EQ(c.start[1][0], -1);  // the receive has no time
  // 1F1B's makespan: (m + pp - 1) (F + B).
  EXPECT_EQ(check_schedule(generate_schedule("1f1b", 4, 8, 1)).makespan, 33);
  EXPECT_EQ(check_schedule(generate_schedule("gpipe", 4, 8, 1)).makespan, 33);
}

TEST(PipelineCheck, ZeroBubbleAndInterleavedBeat1F1B) {
  const double one_f_one_b = unit_makespan(generate_schedule("1f1b", 4, 8, 1));
  EXPECT_LT(unit_makespan(generate_schedule("zb1p", 4, 8, 1)), one_f_one_b);
  EXPECT_LT(unit_makespan(generate_schedule("interleaved", 4, 8, 2)), one_f_one_b);
  EXPECT_LT(unit_makespan(generate_schedule("zbv", 4, 8, 2)), one_f_one_b);
  EXPECT_LT(unit_makespan(generate_schedule("zbv", 2, 8, 2)),
            unit_makespan(generate_schedule("1f1b", 2, 8, 1)));
  // ZB-H1 with F = I = W: 1F1B's bubble of (pp - 1)(F + I + W) shrinks to (pp - 1)(F + I - W).
  EXPECT_EQ(unit_makespan(generate_schedule("zb1p", 4, 8, 1)), 3 * 8 + 3);
}

TEST(PipelineCsv, SaveLoadRoundTrip) {
  const TempDir dir;
  for (auto [name, pp, m, v] : {std::tuple<std::string, int, int, int>{"gpipe", 3, 5, 1},
                                {"1f1b", 4, 8, 1}, {"zb1p", 4, 6, 1},
                                {"interleaved", 2, 4, 3}, {"zbv", 3, 7, 2}}) {
    const Schedule s = generate_schedule(name, pp, m, v);
    const std::string path = dir.file(name + ".csv");
    save_schedule_csv(s, path);
    const Schedule t = load_schedule_csv(path);
    EXPECT_EQ(t.name, path);
    EXPECT_EQ(t.pp, s.pp);
    EXPECT_EQ(t.n_stages, s.n_stages);
    EXPECT_EQ(t.microbatches, s.microbatches);
    EXPECT_EQ(t.ranks, s.ranks) << name;
  }
}

TEST(PipelineCsv, CommentsSpacesAndEmptyCells) {
  const TempDir dir;
  const std::string path = dir.file("hand.csv",
                                    "# a hand-written pp 1 schedule\n"
                                    " 0F0 , 0F1,,0B0\r\n"
                                    "\n"
                                    "0B1,,\n");
  const Schedule s = load_schedule_csv(path);
  // Two lines of actions: pp 2. The second rank computes stage 0 too, which the checker refuses.
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.ranks[0].size(), 3u);
  EXPECT_EQ(s.microbatches, 2);
  EXPECT_TRUE(Contains(check_error(s), "stage 0 is computed on two ranks: rank 0 action 0 (0F0) "
                                        "and rank 1 action 0 (0B1)"));
}

// pp 2, m 2 1F1B, by hand.
const char* k1F1B =
    "0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0RECV_B1,0B0,0B1\n"
    "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n";

std::string load_and_check(const TempDir& dir, const std::string& content) {
  const std::string path = dir.file("broken.csv", content);
  return error_of([&] { check_schedule(load_schedule_csv(path)); });
}

TEST(PipelineCsv, HandWritten1F1BPasses) {
  const TempDir dir;
  EXPECT_EQ(load_and_check(dir, k1F1B), "");
}

TEST(PipelineCsv, MissingSend) {
  const TempDir dir;
  const std::string e = load_and_check(dir,
                                       "0F0,0SEND_F0,0RECV_B0,0F1,0RECV_B1,0B0,0B1\n"
                                       "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
  EXPECT_TRUE(Contains(e, "rank 1 waits at action 5 (1F1) for 0SEND_F1, which rank 0 never runs"));
}

TEST(PipelineCsv, MissingReceive) {
  const TempDir dir;
  const std::string e = load_and_check(dir,
                                       "0F0,0SEND_F0,0RECV_B0,0F1,0SEND_F1,0B0,0B1\n"
                                       "1RECV_F0,1RECV_F1,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n");
  EXPECT_TRUE(Contains(e, "rank 1 action 7 (1SEND_B1) has no matching receive: rank 0 never "
                           "posts 0RECV_B1 for its 0B1"));
}

TEST(PipelineCsv, CycleOfWaits) {
  const TempDir dir;
  // Rank 0 waits for micro-batch 0's gradient before it forwards micro-batch 1; rank 1 waits for
  // micro-batch 1's forward before its backward of micro-batch 0.
  const std::string e = load_and_check(dir,
                                       "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
                                       "1RECV_F0,1RECV_F1,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n");
  EXPECT_TRUE(Contains(e, "deadlocks"));
  EXPECT_TRUE(Contains(e, "rank 0 waits at action 3 (0B0) for 1SEND_B0, which rank 1 has not run "
                           "(rank 1 waits at action 3 (1F1) for 0SEND_F1)"));
  EXPECT_TRUE(Contains(e, "rank 1 waits at action 3 (1F1) for 0SEND_F1, which rank 0 has not run "
                           "(rank 0 waits at action 3 (0B0) for 1SEND_B0)"));
}

TEST(PipelineCsv, WeightGradientBeforeItsInput) {
  const TempDir dir;
  const std::string e = load_and_check(dir, "0F0,0F1,0F2,0I0,0I1,0W2,0W0,0W1,0I2\n");
  EXPECT_TRUE(Contains(e, "rank 0 action 5 (0W2) runs before its backward input 0I2 (action 8)"));
}

TEST(PipelineCsv, UnknownAction) {
  const TempDir dir;
  const std::string path = dir.file("bad.csv", "# header\n0F0,0F1\n1F0, 1FORWARD1 ,1B0\n");
  const std::string e = error_of([&] { load_schedule_csv(path); });
  EXPECT_TRUE(Contains(e, path + " line 3 (rank 1), cell 2: not a pipeline action: '1FORWARD1'"));
}

TEST(PipelineCsv, MissingMicroBatch) {
  const TempDir dir;
  const std::string e = load_and_check(dir, "0F0,0F1,0F3,0B0,0B1,0B3\n");
  EXPECT_TRUE(Contains(e, "micro-batch 2 of stage 0 has no forward: no rank runs 0F2"));
}

TEST(PipelineCheck, OtherRuleBreaks) {
  auto with = [](std::vector<std::vector<std::string>> rows) {
    Schedule s;
    s.pp = int(rows.size());
    for (const auto& row : rows) {
      s.ranks.emplace_back();
      for (const std::string& t : row) {
        s.ranks.back().push_back(parse_action(t));
        s.n_stages = std::max(s.n_stages, s.ranks.back().back().stage + 1);
        s.microbatches = std::max(s.microbatches, s.ranks.back().back().mb + 1);
      }
    }
    return check_error(s);
  };
  EXPECT_TRUE(Contains(with({{"0F0", "0F0", "0B0"}}), "0F0 appears twice: rank 0 action 0 (0F0) "
                                                       "and rank 0 action 1 (0F0)"));
  EXPECT_TRUE(Contains(with({{"0B0", "0F0"}}), "(0B0) runs before its forward 0F0 (action 1)"));
  EXPECT_TRUE(Contains(with({{"0F0", "0B0", "0I0", "0W0"}}), "has both a whole backward"));
  EXPECT_TRUE(Contains(with({{"0F0", "0I0"}}), "(0I0) has no weight gradient 0W0 after it"));
  // Two stages on one rank hand over locally: a send between them is an error, and order counts.
  EXPECT_TRUE(Contains(with({{"0F0", "0SEND_F0", "1F0", "1B0", "0B0"}}),
              "both on rank 0, which hand over without a send or receive"));
  EXPECT_TRUE(Contains(with({{"1F0", "0F0", "1B0", "0B0"}}),
              "(1F0) runs before the forward whose output it takes, 0F0 (action 1)"));
  EXPECT_TRUE(Contains(with({{"0F0", "1F0", "0B0", "1B0"}}),
              "(0B0) runs before the backward whose input gradient it takes, 1B0"));
  EXPECT_TRUE(Contains(with({{"0F0", "0SEND_F0", "0RECV_B0", "0B0"},
                    {"1F0", "1RECV_F0", "1B0", "1SEND_B0"}}),
              "rank 1 action 1 (1RECV_F0) is posted after the compute that waits for "
                        "it, 1F0 (action 0)"));
  EXPECT_TRUE(Contains(with({{"0F0", "0SEND_F0", "0RECV_B0", "0B0", "1SEND_B0"},
                    {"1RECV_F0", "1F0", "1B0"}}),
              "(1SEND_B0) is on rank 0, but stage 1 runs on rank 1"));
  EXPECT_TRUE(Contains(with({{"0F0", "0B0"}, {}}), "rank 1 computes no stage"));
  Schedule s = generate_schedule("1f1b", 2, 3, 1);
  s.microbatches = 2;
  EXPECT_TRUE(Contains(check_error(s), "rank 0 action 7 (0F2) names micro-batch 2, but the "
                                        "schedule has 2 micro-batches (0..1)"));
  s.microbatches = 3;
  s.n_stages = 1;
  EXPECT_TRUE(Contains(check_error(s),
              "rank 1 action 0 (1RECV_F0) names stage 1, but the schedule has 1 stages"));
}

TEST(PipelineTimeline, TextAndChromeTrace) {
  const Schedule s = generate_schedule("1f1b", 4, 8, 1);
  const ScheduleCheck c = check_schedule(s);
  const std::string text = timeline_text(s, c);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 5);  // the time axis and 4 ranks
  EXPECT_TRUE(Contains(text, "rank 0  F0 F1 F2 F3 ......"));
  EXPECT_TRUE(Contains(text, "rank 3  .........F0 B0    F1 B1"));

  const TempDir dir;
  const std::string path = dir.file("trace.json");
  write_chrome_trace(path, simulated_trace(s, c, 1000));
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  int complete = 0, names = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "X") {
      ++complete;
      if (e.at("name") == "3B0") {
        EXPECT_EQ(e.at("tid"), 3);
        EXPECT_EQ(e.at("ts"), 4000.0);
        EXPECT_EQ(e.at("dur"), 2000.0);
      }
    }
    if (e.at("name") == "thread_name") {
      EXPECT_EQ(e.at("args").at("name"), "rank " + std::to_string(int(e.at("tid"))));
      ++names;
    }
  }
  EXPECT_EQ(complete, 4 * 8 * 2);
  EXPECT_EQ(names, 4);
}

}  // namespace
}  // namespace cleave
