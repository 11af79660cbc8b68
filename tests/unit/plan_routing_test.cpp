// A run's routing as `cleave plan --routing` reads it: records weighted by the steps they cover, a
// resumed run's replayed steps counted once, and a record of the wrong type refused naming the
// file and line; the busiest ep rank's share record by record.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cleave/base/check.h"
#include "cleave/plan/routing.h"

namespace cleave {
namespace {

ModelConfig two_experts() {
  ModelConfig c;
  c.n_layers = 1;
  c.moe_experts = 2;
  c.moe_top_k = 1;
  return c;
}

// A metrics.jsonl of `lines` in a fresh folder; returns its path.
std::string metrics(const std::string& name, const std::vector<std::string>& lines) {
  const auto dir = std::filesystem::temp_directory_path() / ("cleave_routing_" + name);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "metrics.jsonl").string();
  std::ofstream out(path);
  for (const std::string& l : lines) out << l << "\n";
  return path;
}

std::string record(int step, double e0, double e1, double dropped) {
  return "{\"step\":" + std::to_string(step) + ",\"loss\":5,\"moe_layers\":[{\"layer\":0," +
         "\"rows_per_expert\":[" + std::to_string(e0) + "," + std::to_string(e1) +
         "],\"dropped_per_step\":" + std::to_string(dropped) + "}]}";
}

TEST(PlanRouting, RecordsWeighByTheirStepsAndReplayedStepsCountOnce) {
  // Steps 1-2 all to expert 0, 3-4 all to expert 1: a mean of half each. The run then resumed
  // from step 2 and logged steps 3-4 again (with other figures, to show they are not counted),
  // then 5-8 balanced.
  const std::string path = metrics("resume", {record(2, 8, 0, 0), record(4, 0, 8, 0),
                                              record(4, 8, 0, 0), record(8, 4, 4, 0)});
  const ExpertRouting r = read_routing(path, two_experts());
  EXPECT_EQ(r.steps, 8);
  ASSERT_EQ(r.records.size(), 3u);
  ASSERT_EQ(r.share.at(0).size(), 2u);
  // (2 x 8 + 4 x 4) / 64 and (2 x 8 + 4 x 4) / 64.
  EXPECT_DOUBLE_EQ(r.share.at(0)[0], 0.5);
  EXPECT_DOUBLE_EQ(r.share.at(0)[1], 0.5);
  // The busiest record for expert 0 gave it everything.
  EXPECT_DOUBLE_EQ(peak_share(&r, 0, 2, 0, 1), 1.0);
}

TEST(PlanRouting, DroppedChoicesLowerTheShares) {
  const std::string path = metrics("dropped", {record(1, 6, 2, 0), record(2, 3, 3, 2)});
  const ExpertRouting r = read_routing(path, two_experts());
  // Kept (6 + 3, 2 + 3) of 16 choices, 2 dropped.
  EXPECT_DOUBLE_EQ(r.share.at(0)[0], 9.0 / 16);
  EXPECT_DOUBLE_EQ(r.share.at(0)[1], 5.0 / 16);
}

// read_routing refuses `path` with a message naming its line and containing `what`.
void expect_refused(const std::string& path, int line, const std::string& what) {
  try {
    read_routing(path, two_experts());
    ADD_FAILURE() << path << " was read";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path + ":" + std::to_string(line) + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

// The busiest ep rank's share is taken record by record: here rank 0's experts get more in the
// first record and rank 1's in the second, so the mean routing (0.45 and 0.55) hides a wait for
// 0.6 and then 0.7 of the choices.
TEST(PlanRouting, TheBusiestRankIsTakenRecordByRecord) {
  ExpertRouting r;
  r.records = {{{3, {0.4, 0.2, 0.2, 0.2}}}, {{3, {0.1, 0.2, 0.3, 0.4}}}};
  r.share = {{3, {0.25, 0.2, 0.25, 0.3}}};
  EXPECT_NEAR(busiest_rank_share(&r, 3, 4, 2), 0.65, 1e-12);
  EXPECT_NEAR(busiest_rank_share(&r, 3, 4, 4), 0.4, 1e-12);
  EXPECT_NEAR(busiest_rank_share(&r, 3, 4, 1), 1.0, 1e-12);
  // Balanced where there is no routing or no figures for the layer.
  EXPECT_DOUBLE_EQ(busiest_rank_share(nullptr, 3, 4, 2), 0.5);
  EXPECT_DOUBLE_EQ(busiest_rank_share(&r, 1, 4, 4), 0.25);
}

TEST(PlanRouting, AWrongTypeOrAMissingKeyNamesTheFileAndLine) {
  expect_refused(metrics("type", {record(1, 1, 1, 0),
                                  "{\"step\":2,\"moe_layers\":[{\"layer\":0,\"rows_per_expert\":"
                                  "\"many\",\"dropped_per_step\":0}]}"}),
                 2, "type must be array");
  expect_refused(
      metrics("missing", {"{\"step\":1,\"moe_layers\":[{\"layer\":0,\"rows_per_expert\":[1,1]}]}"}),
      1, "dropped_per_step");
}

}  // namespace
}  // namespace cleave
