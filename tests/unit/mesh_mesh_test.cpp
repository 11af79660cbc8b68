// The device mesh: groups for several worlds and degree choices, the partition properties every
// axis must have, validation messages, and the host map of describe_mesh.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cleave/base/check.h"
#include "cleave/mesh/mesh.h"

namespace cleave {
namespace {

using Groups = std::vector<std::vector<int>>;
const std::vector<Axis> kAll = {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp, Axis::tp};

MeshDegrees degrees(int pp, int dp_replicate, int dp_shard, int cp, int tp) {
  MeshDegrees d;
  d.pp = pp, d.dp_replicate = dp_replicate, d.dp_shard = dp_shard, d.cp = cp, d.tp = tp;
  return d;
}

std::string error_of(int world, MeshDegrees d) {
  try {
    Mesh m(world, d);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every property that must hold for any valid mesh.
void check_properties(const Mesh& m) {
  const int world = m.world();
  int product = 1;
  for (Axis a : kAll) product *= m.degree(a);
  ASSERT_EQ(product, world);
  for (int r = 0; r < world; ++r) {
    const auto c = m.coords(r);
    EXPECT_EQ(m.rank_of(c), r);
    // The rank formula, tp innermost.
    int expect = 0;
    for (Axis a : kAll) expect = expect * m.degree(a) + c[int(a)];
    EXPECT_EQ(expect, r);
    // tp groups are consecutive ranks.
    const std::vector<int> tp = m.group(r, Axis::tp);
    for (int k = 0; k < int(tp.size()); ++k) EXPECT_EQ(tp[k], tp[0] + k);
  }
  for (Axis a : kAll) {
    const Groups groups = m.all_groups({a});
    EXPECT_EQ(int(groups.size()), world / m.degree(a)) << axis_name(a);
    std::vector<int> seen(world, 0);
    for (const auto& g : groups) {
      ASSERT_EQ(int(g.size()), m.degree(a)) << axis_name(a);
      for (int k = 0; k < int(g.size()); ++k) {
        ++seen[g[k]];
        // Ordered by coordinate; the other coordinates equal.
        auto c = m.coords(g[0]);
        c[int(a)] = k;
        EXPECT_EQ(m.rank_of(c), g[k]);
        EXPECT_EQ(m.group(g[k], a), g);
      }
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << axis_name(a) << " rank " << r;
    for (size_t i = 1; i < groups.size(); ++i) EXPECT_LT(groups[i - 1][0], groups[i][0]);
  }
  // The whole data-parallel group: R * S ranks, a partition too.
  const std::vector<Axis> dp = {Axis::dp_replicate, Axis::dp_shard};
  const int RS = m.degree(Axis::dp_replicate) * m.degree(Axis::dp_shard);
  std::set<int> covered;
  for (const auto& g : m.all_groups(dp)) {
    ASSERT_EQ(int(g.size()), RS);
    EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
    for (int r : g) {
      EXPECT_TRUE(covered.insert(r).second);
      EXPECT_EQ(m.group(r, dp), g);
    }
  }
  EXPECT_EQ(int(covered.size()), world);
}

TEST(Mesh, World8PipelineShardTensor) {
  const Mesh m(8, degrees(2, 1, 2, 1, 2));
  check_properties(m);
  EXPECT_EQ(m.all_groups({Axis::tp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.all_groups({Axis::dp_shard}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.all_groups({Axis::pp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.all_groups({Axis::cp}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(m.group(5, Axis::tp), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(5, Axis::dp_shard), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(5, Axis::pp), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.coords(5), (std::array<int, kAxes>{1, 0, 0, 0, 1}));
  EXPECT_EQ(m.coords(6), (std::array<int, kAxes>{1, 0, 1, 0, 0}));
  // Several axes: flattened in mesh order (ascending ranks), whatever order the caller lists.
  EXPECT_EQ(m.group(5, {Axis::dp_shard, Axis::tp}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(5, {Axis::tp, Axis::dp_shard}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(2, {Axis::pp, Axis::tp}), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(m.all_groups({Axis::pp, Axis::tp}), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.all_groups(kAll), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(m.group(3, std::vector<Axis>{}), (std::vector<int>{3}));
}

TEST(Mesh, World12RestOnDpShard) {
  const Mesh m(12, degrees(1, 1, -1, 1, 2));
  EXPECT_EQ(m.degree(Axis::dp_shard), 6);
  EXPECT_EQ(m.degrees().dp_shard, 6);
  check_properties(m);
  EXPECT_EQ(m.all_groups({Axis::dp_shard}),
            (Groups{{0, 2, 4, 6, 8, 10}, {1, 3, 5, 7, 9, 11}}));
  EXPECT_EQ(m.group(7, Axis::tp), (std::vector<int>{6, 7}));

  const Mesh n(12, degrees(1, 2, -1, 3, 1));
  EXPECT_EQ(n.degree(Axis::dp_shard), 2);
  check_properties(n);
  EXPECT_EQ(n.all_groups({Axis::cp}), (Groups{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}}));
  EXPECT_EQ(n.all_groups({Axis::dp_replicate}),
            (Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(n.group(4, {Axis::dp_replicate, Axis::dp_shard}), (std::vector<int>{1, 4, 7, 10}));
}

TEST(Mesh, World1) {
  const Mesh m(1, MeshDegrees{});
  check_properties(m);
  for (Axis a : kAll) EXPECT_EQ(m.group(0, a), (std::vector<int>{0}));
  EXPECT_EQ(m.coords(0), (std::array<int, kAxes>{0, 0, 0, 0, 0}));
  EXPECT_EQ(Mesh(1, degrees(1, 1, 1, -1, 1)).degree(Axis::cp), 1);
}

TEST(Mesh, ManyShapesKeepTheProperties) {
  for (int world : {1, 2, 4, 6, 8, 12, 16, 24, 32, 48})
    for (int tp : {1, 2, 4})
      for (int cp : {1, 2, 3})
        for (int pp : {1, 2, 3})
          for (int rep : {1, 2}) {
            if (world % (tp * cp * pp * rep) != 0) continue;
            SCOPED_TRACE("world " + std::to_string(world) + " pp " + std::to_string(pp) +
                         " dp_replicate " + std::to_string(rep) + " cp " + std::to_string(cp) +
                         " tp " + std::to_string(tp));
            const Mesh m(world, degrees(pp, rep, -1, cp, tp));
            check_properties(m);
          }
}

TEST(Mesh, AxisNamesAndDegreeIndexing) {
  EXPECT_STREQ(axis_name(Axis::pp), "pp");
  EXPECT_STREQ(axis_name(Axis::dp_replicate), "dp_replicate");
  EXPECT_STREQ(axis_name(Axis::dp_shard), "dp_shard");
  EXPECT_STREQ(axis_name(Axis::cp), "cp");
  EXPECT_STREQ(axis_name(Axis::tp), "tp");
  MeshDegrees d;
  d[Axis::cp] = 3;
  d[Axis::dp_replicate] = 5;
  EXPECT_EQ(d.cp, 3);
  EXPECT_EQ(d.dp_replicate, 5);
  const MeshDegrees& c = d;
  EXPECT_EQ(c[Axis::cp], 3);
  EXPECT_EQ(c[Axis::tp], 1);
}

// Messages start the error text; CLEAVE_FAIL appends " [file:line]".
void expect_message(const std::string& error, const std::string& message) {
  EXPECT_EQ(error.rfind(message + " [", 0), 0u) << "got: " << error;
}

TEST(Mesh, ValidationMessages) {
  expect_message(error_of(4, degrees(1, 2, 3, 1, 1)),
                 "parallel degrees pp=1 x dp_replicate=2 x dp_shard=3 x cp=1 x tp=1 = 6 do not "
                 "multiply to the world size 4");
  expect_message(error_of(8, degrees(1, 1, 1, 1, 4)),
                 "parallel degrees pp=1 x dp_replicate=1 x dp_shard=1 x cp=1 x tp=4 = 4 do not "
                 "multiply to the world size 8");
  expect_message(error_of(8, degrees(1, 1, -1, 1, -1)),
                 "-1 is allowed on one axis only (dp_shard and tp are both -1)");
  expect_message(error_of(8, degrees(-1, 1, -1, 1, -1)),
                 "-1 is allowed on one axis only (pp, dp_shard and tp are all -1)");
  expect_message(error_of(8, degrees(1, 1, -1, 1, 3)),
                 "dp_shard = -1: the other degrees multiply to 3, which does not divide the world "
                 "size 8");
  expect_message(error_of(4, degrees(2, 1, 1, 4, -1)),
                 "tp = -1: the other degrees multiply to 8, which does not divide the world size 4");
  expect_message(error_of(8, degrees(1, 1, 1, 1, 0)), "degree must be >= 1 or -1 (tp = 0)");
  expect_message(error_of(8, degrees(1, -2, 1, 1, 1)), "degree must be >= 1 or -1 (dp_replicate = -2)");
  // A bad degree is reported before a second -1.
  expect_message(error_of(8, degrees(-1, 1, 1, 0, -1)), "degree must be >= 1 or -1 (cp = 0)");
  expect_message(error_of(0, MeshDegrees{}), "the world size must be >= 1 (got 0)");
  // A product too large for 64 bits is still named, not wrapped around.
  expect_message(error_of(2, degrees(65536, 65536, 65536, 65536, 65536)),
                 "parallel degrees pp=65536 x dp_replicate=65536 x dp_shard=65536 x cp=65536 x "
                 "tp=65536 = more than 9223372036854775807 do not multiply to the world size 2");
  EXPECT_EQ(error_of(8, degrees(2, 1, 2, 1, 2)), "");
}

TEST(Mesh, OutOfRangeRanksAndCoordinates) {
  const Mesh m(8, degrees(2, 1, 2, 1, 2));
  std::string e;
  try {
    m.coords(8);
  } catch (const Error& err) {
    e = err.what();
  }
  expect_message(e, "rank 8 is outside the world of 8 ranks");
  EXPECT_THROW(m.group(-1, Axis::tp), Error);
  e.clear();
  try {
    m.rank_of({0, 0, 0, 0, 2});
  } catch (const Error& err) {
    e = err.what();
  }
  expect_message(e, "tp coordinate 2 is outside [0, 2) (tp degree 2)");
  EXPECT_THROW(m.rank_of({0, 1, 0, 0, 0}), Error);
}

// The lines of describe_mesh that list groups, as "[ranks]  verdict".
std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (line.find(needle) != std::string::npos) out.push_back(line);
    at = end + 1;
  }
  return out;
}

TEST(DescribeMesh, MarksGroupsCrossingHosts) {
  // World 8 on two hosts of 4: pp crosses hosts, dp_shard and tp stay within one.
  const Mesh m(8, degrees(2, 1, 2, 1, 2));
  const std::string text = describe_mesh(m, 4);
  EXPECT_NE(text.find("device mesh: world 8 = pp 2 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("2 hosts of 4 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("pp (degree 2): activations and gradients point-to-point between stages\n"
                      "  4 groups of 2 ranks: 0 intra-host, 4 crossing hosts\n"
                      "  [0, 4]  crosses hosts (0, 1)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dp_shard (degree 2): parameter all-gather and gradient reduce-scatter "
                      "(ZeRO/FSDP)\n  4 groups of 2 ranks: 4 intra-host, 0 crossing hosts\n"
                      "  [0, 2]  intra-host (host 0)\n  [1, 3]  intra-host (host 0)\n"
                      "  [4, 6]  intra-host (host 1)\n  [5, 7]  intra-host (host 1)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  [6, 7]  intra-host (host 1)\n"), std::string::npos) << text;
  EXPECT_EQ(lines_with(text, "crosses hosts").size(), 4u) << text;
  EXPECT_EQ(lines_with(text, "intra-host (").size(), 8u) << text;
  EXPECT_NE(text.find("summary: 12 groups on 3 axes, 4 crossing hosts (pp)\n"), std::string::npos)
      << text;
  // Axes of degree 1 get no section.
  EXPECT_EQ(text.find("\ncp ("), std::string::npos) << text;
  EXPECT_EQ(text.find("\ndp_replicate ("), std::string::npos) << text;
}

TEST(DescribeMesh, DataParallelAcrossHosts) {
  // World 8, dp_replicate 2 outermost: replicas on different hosts, shards within each host.
  const Mesh m(8, degrees(1, 2, 4, 1, 1));
  const std::string text = describe_mesh(m, 4);
  EXPECT_NE(text.find("dp_replicate (degree 2): gradient all-reduce\n"
                      "  4 groups of 2 ranks: 0 intra-host, 4 crossing hosts\n"
                      "  [0, 4]  crosses hosts (0, 1)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  [0, 1, 2, 3]  intra-host (host 0)\n  [4, 5, 6, 7]  intra-host (host 1)\n"),
            std::string::npos)
      << text;
  // Both data axes > 1: a combined dp section after dp_shard, one group of all 8 ranks.
  EXPECT_NE(text.find("dp = dp_replicate x dp_shard (degree 2 x 4 = 8)"), std::string::npos) << text;
  EXPECT_NE(text.find("  [0, 1, 2, 3, 4, 5, 6, 7]  crosses hosts (0, 1)\n"), std::string::npos)
      << text;
  EXPECT_LT(text.find("\ndp_shard ("), text.find("\ndp = "));
  EXPECT_NE(text.find("summary: 7 groups on 3 axes, 5 crossing hosts (dp_replicate and dp)\n"),
            std::string::npos)
      << text;
  // On one host of 8 nothing crosses.
  const std::string one = describe_mesh(m, 8);
  EXPECT_EQ(one.find("crosses hosts"), std::string::npos) << one;
  EXPECT_NE(one.find("1 host of 8 ranks\n"), std::string::npos) << one;
  // One rank per host: every group of more than one rank crosses.
  const std::string each = describe_mesh(m, 1);
  EXPECT_EQ(each.find("intra-host ("), std::string::npos) << each;
}

TEST(DescribeMesh, UnevenHostsAndSingleRank) {
  const Mesh m(6, degrees(1, 1, 2, 3, 1));
  const std::string text = describe_mesh(m, 4);
  EXPECT_NE(text.find("2 hosts of 4 ranks (the last holds 2)"), std::string::npos) << text;
  EXPECT_NE(text.find("  [0, 1, 2]  intra-host (host 0)\n  [3, 4, 5]  crosses hosts (0, 1)\n"),
            std::string::npos)
      << text;
  const std::string single = describe_mesh(Mesh(1, MeshDegrees{}), 1);
  EXPECT_NE(single.find("every degree is 1"), std::string::npos) << single;
  EXPECT_THROW(describe_mesh(m, 0), Error);
}

}  // namespace
}  // namespace cleave
