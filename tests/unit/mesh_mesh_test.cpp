// The device mesh: groups for several worlds and degree choices, the partition properties every
// axis must have, axes carved out of others (ep), validation messages, and the host map of
// describe_mesh.
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

Mesh with_ep(int world, MeshDegrees d, int ep) {
  Mesh m(world, d);
  carve_ep(m, ep);
  return m;
}

template <class F>
std::string error_from(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::set<int> as_set(const std::vector<int>& g) { return {g.begin(), g.end()}; }

// Every property of ep and efsdp, carved out of dp_shard x cp.
void check_ep(const Mesh& m) {
  const int world = m.world(), E = m.degree(kEp);
  const int SC = m.degree(Axis::dp_shard) * m.degree(Axis::cp);
  const std::vector<Axis> shard_cp = {Axis::dp_shard, Axis::cp};
  ASSERT_EQ(E * m.degree(kEfsdp), SC);
  const Groups ep = m.all_groups({kEp}), efsdp = m.all_groups({kEfsdp});
  ASSERT_EQ(int(ep.size()), world / E);
  ASSERT_EQ(int(efsdp.size()), world * E / SC);
  // The ep groups, and the efsdp groups, partition the ranks; every rank finds its own group.
  for (const Groups* groups : {&ep, &efsdp}) {
    const std::string name = groups == &ep ? kEp : kEfsdp;
    std::vector<int> seen(world, 0);
    for (const auto& g : *groups) {
      EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
      for (int k = 0; k < int(g.size()); ++k) {
        ++seen[g[k]];
        EXPECT_EQ(m.group(g[k], {name}), g);
        EXPECT_EQ(m.coord(g[k], name), k);
      }
    }
    for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << name << " rank " << r;
    for (size_t i = 1; i < groups->size(); ++i) EXPECT_LT((*groups)[i - 1][0], (*groups)[i][0]);
  }
  for (int r = 0; r < world; ++r) {
    const std::vector<int> sc = m.group(r, shard_cp), g = m.group(r, {kEp});
    // Inside one dp_shard x cp group, on one pp, dp_replicate and tp coordinate.
    const std::set<int> in_sc = as_set(sc);
    for (int q : g) {
      EXPECT_TRUE(in_sc.count(q)) << "ep peer " << q << " of rank " << r;
      EXPECT_EQ(m.coords(q)[int(Axis::tp)], m.coords(r)[int(Axis::tp)]);
      EXPECT_EQ(m.coords(q)[int(Axis::pp)], m.coords(r)[int(Axis::pp)]);
      EXPECT_EQ(m.coords(q)[int(Axis::dp_replicate)], m.coords(r)[int(Axis::dp_replicate)]);
    }
    // efsdp x ep is dp_shard x cp again, rank by rank: position o * E + i is efsdp o, ep i.
    std::vector<int> product;
    for (int o : m.group(r, {kEfsdp}))
      for (int i : m.group(o, {kEp})) product.push_back(i);
    EXPECT_EQ(product, sc) << "rank " << r;
    EXPECT_EQ(m.group(r, {kEfsdp, kEp}), sc);
    EXPECT_EQ(m.group(r, {kEp, kEfsdp}), sc);
    EXPECT_EQ(m.coord(r, kEfsdp) * E + m.coord(r, kEp),
              m.coords(r)[int(Axis::dp_shard)] * m.degree(Axis::cp) + m.coords(r)[int(Axis::cp)]);
    // The experts' whole data-parallel group: their replicas times their shards, ascending.
    const std::vector<int> edp = m.group(r, {"dp_replicate", kEfsdp});
    EXPECT_EQ(int(edp.size()), m.degree(Axis::dp_replicate) * m.degree(kEfsdp));
    EXPECT_TRUE(std::is_sorted(edp.begin(), edp.end()));
    EXPECT_TRUE(as_set(edp).count(r));
    std::set<int> spanned;
    for (int q : m.group(r, Axis::dp_replicate))
      for (int e : m.group(q, {kEfsdp})) spanned.insert(e);
    EXPECT_EQ(as_set(edp), spanned);
    // Whole axes by name are the whole axes.
    for (Axis a : kAll) {
      EXPECT_EQ(m.group(r, {axis_name(a)}), m.group(r, a));
      EXPECT_EQ(m.coord(r, axis_name(a)), m.coords(r)[int(a)]);
    }
    EXPECT_EQ(m.group(r, {"pp", kEp}), m.group(r, {kEp, "pp"}));
  }
  EXPECT_EQ(m.all_groups({kEfsdp, kEp}), m.all_groups(shard_cp));
  if (E == 1) {
    EXPECT_EQ(efsdp, m.all_groups(shard_cp));
  }
  if (E == SC) {
    EXPECT_EQ(ep, m.all_groups(shard_cp));
  }
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

TEST(MeshCarve, EpPropertiesForEveryWorldUpTo16) {
  int meshes = 0;
  for (int world = 1; world <= 16; ++world)
    for (int pp : divisors(world))
      for (int rep : divisors(world / pp))
        for (int shard : divisors(world / pp / rep))
          for (int cp : divisors(world / pp / rep / shard))
            for (int ep : divisors(shard * cp)) {
              const int tp = world / pp / rep / shard / cp;
              SCOPED_TRACE("world " + std::to_string(world) + " pp " + std::to_string(pp) +
                           " dp_replicate " + std::to_string(rep) + " dp_shard " +
                           std::to_string(shard) + " cp " + std::to_string(cp) + " tp " +
                           std::to_string(tp) + " ep " + std::to_string(ep));
              check_ep(with_ep(world, degrees(pp, rep, shard, cp, tp), ep));
              ++meshes;
            }
  EXPECT_EQ(meshes, 741);  // every (pp, dp_replicate, dp_shard, cp, tp, ep) of worlds 1 to 16
}

TEST(MeshCarve, World8Shard4Tp2Ep2) {
  const Mesh m = with_ep(8, degrees(1, 1, 4, 1, 2), 2);
  EXPECT_EQ(m.degree(kEp), 2);
  EXPECT_EQ(m.degree(kEfsdp), 2);
  // ep: dp_shard coordinates {0, 1} and {2, 3}, one tp coordinate each.
  EXPECT_EQ(m.all_groups({kEp}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.all_groups({kEfsdp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group(5, {kEp}), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(5, {kEfsdp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group(5, {kEp, "tp"}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.group(5, {"dp_replicate", kEfsdp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.coord(6, kEp), 1);
  EXPECT_EQ(m.coord(6, kEfsdp), 1);
  EXPECT_EQ(m.coord(2, kEfsdp), 0);
  // The whole axes are untouched by the carve.
  EXPECT_EQ(m.all_groups({Axis::dp_shard}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(m.all_groups({Axis::tp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  ASSERT_EQ(m.carved().size(), 1u);
  EXPECT_EQ(m.carved()[0].from, (std::vector<Axis>{Axis::dp_shard, Axis::cp}));
}

TEST(MeshCarve, EpAcrossShardAndContext) {
  // dp_shard 2 x cp 4 = 8 ranks, f = s * 4 + c = rank: ep 4 is one cp ring, ep 2 half of one.
  const Mesh m = with_ep(8, degrees(1, 1, 2, 4, 1), 4);
  EXPECT_EQ(m.all_groups({kEp}), m.all_groups({Axis::cp}));
  EXPECT_EQ(m.all_groups({kEfsdp}), m.all_groups({Axis::dp_shard}));
  const Mesh n = with_ep(8, degrees(1, 1, 2, 4, 1), 2);
  EXPECT_EQ(n.all_groups({kEp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(n.all_groups({kEfsdp}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // ep 8 spans both dp_shard coordinates.
  const Mesh o = with_ep(8, degrees(1, 1, 2, 4, 1), 8);
  EXPECT_EQ(o.all_groups({kEp}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(MeshCarve, AnyConsecutiveAxesAndSeveralCarves) {
  // World 24 = pp 2 x dp_replicate 1 x dp_shard 2 x cp 3 x tp 2; the carve is not ep-only.
  Mesh m(24, degrees(2, 1, 2, 3, 2));
  m.carve("x", 3, {Axis::tp, Axis::cp}, "y");  // from cp x tp = 6, in any order
  m.carve("a", 2, {Axis::pp}, "b");
  EXPECT_EQ(m.carved()[0].from, (std::vector<Axis>{Axis::cp, Axis::tp}));
  EXPECT_EQ(m.degree("x"), 3);
  EXPECT_EQ(m.degree("y"), 2);
  EXPECT_EQ(m.degree("b"), 1);
  // f = c * 2 + t within cp x tp: x is f % 3, y is f / 3.
  EXPECT_EQ(m.group(0, {"x"}), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(m.group(4, {"x"}), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(m.group(4, {"y"}), (std::vector<int>{1, 4}));
  EXPECT_EQ(m.group(4, {"y", "x"}), m.group(4, {Axis::cp, Axis::tp}));
  EXPECT_EQ(m.group(4, {"a"}), m.group(4, Axis::pp));
  EXPECT_EQ(m.group(4, {"b"}), (std::vector<int>{4}));
  // Mixed with whole axes, outer first: dp_shard (stride 6) then x (stride 1), pp as "a".
  EXPECT_EQ(m.group(4, {"x", "dp_shard"}), (std::vector<int>{3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(m.group(4, {"x", "a"}), (std::vector<int>{3, 4, 5, 15, 16, 17}));
  EXPECT_EQ(m.all_groups({"x", "dp_shard", "a"}).size(), 2u);
  EXPECT_EQ(m.all_groups(std::vector<std::string>{}).size(), 24u);
}

TEST(MeshCarve, ErrorsNameTheNumbers) {
  Mesh m(8, degrees(1, 1, 4, 1, 2));
  expect_message(error_from([&] { carve_ep(m, 3); }), "ep 3 does not divide dp_shard x cp = 4");
  expect_message(error_from([&] { carve_ep(m, 8); }), "ep 8 does not divide dp_shard x cp = 4");
  expect_message(error_from([&] { carve_ep(m, 0); }), "degree must be >= 1 (ep = 0)");
  expect_message(error_from([&] { m.carve("x", 2, {Axis::pp, Axis::cp}, "y"); }),
                 "x must be carved from consecutive mesh axes, not from pp x cp (mesh order: pp, "
                 "dp_replicate, dp_shard, cp, tp)");
  expect_message(error_from([&] { m.carve("x", 1, {}, "y"); }), "x is carved from no mesh axes");
  expect_message(error_from([&] { m.carve("tp", 1, {Axis::cp}, "y"); }),
                 "mesh axis tp exists already");
  expect_message(error_from([&] { m.carve("x", 1, {Axis::cp}, "x"); }),
                 "the two parts of a carve need two names (both are x)");
  expect_message(error_from([&] { m.carve("", 1, {Axis::cp}, "y"); }),
                 "a carved mesh axis needs a name");
  EXPECT_TRUE(m.carved().empty());  // a failed carve leaves the mesh as it was
  carve_ep(m, 2);
  expect_message(error_from([&] { carve_ep(m, 2); }), "mesh axis ep exists already");
  expect_message(error_from([&] { m.group(0, {"edp"}); }),
                 "unknown mesh axis 'edp' (the mesh has pp, dp_replicate, dp_shard, cp, tp, efsdp "
                 "and ep)");
  expect_message(error_from([&] { m.group(0, {kEp, "dp_shard"}); }),
                 "mesh axes ep and dp_shard overlap on dp_shard: a group cannot be along both");
  expect_message(error_from([&] { m.all_groups({"cp", kEfsdp}); }),
                 "mesh axes cp and efsdp overlap on cp: a group cannot be along both");
  m.carve("x", 2, {Axis::cp, Axis::tp}, "y");
  expect_message(error_from([&] { m.group(0, {kEp, "x"}); }),
                 "mesh axes ep and x overlap on cp: a group cannot be along both");
  expect_message(error_from([&] { m.degree("z"); }),
                 "unknown mesh axis 'z' (the mesh has pp, dp_replicate, dp_shard, cp, tp, efsdp, "
                 "ep, y and x)");
  expect_message(error_from([&] { m.group(8, {kEp}); }), "rank 8 is outside the world of 8 ranks");
  expect_message(error_from([&] { m.coord(-1, kEp); }), "rank -1 is outside the world of 8 ranks");
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


TEST(DescribeMesh, ListsCarvedAxes) {
  const Mesh m = with_ep(8, degrees(1, 1, 4, 1, 2), 2);
  const std::string text = describe_mesh(m, 4);
  EXPECT_EQ(text,
            "device mesh: world 8 = pp 1 x dp_replicate 1 x dp_shard 4 x cp 1 x tp 2\n"
            "hosts: 2 hosts of 4 ranks; rank r is on host r / 4\n"
            "\n"
            "dp_shard (degree 4): parameter all-gather and gradient reduce-scatter (ZeRO/FSDP)\n"
            "  2 groups of 4 ranks: 0 intra-host, 2 crossing hosts\n"
            "  [0, 2, 4, 6]  crosses hosts (0, 1)\n"
            "  [1, 3, 5, 7]  crosses hosts (0, 1)\n"
            "\n"
            "tp (degree 2): all-reduce / all-gather / reduce-scatter of activations within each "
            "block\n"
            "  4 groups of 2 ranks: 4 intra-host, 0 crossing hosts\n"
            "  [0, 1]  intra-host (host 0)\n"
            "  [2, 3]  intra-host (host 0)\n"
            "  [4, 5]  intra-host (host 1)\n"
            "  [6, 7]  intra-host (host 1)\n"
            "\n"
            "efsdp (degree 2, carved from dp_shard x cp = 4, outer): expert parameter all-gather "
            "and gradient reduce-scatter (ZeRO/FSDP of the experts)\n"
            "  4 groups of 2 ranks: 0 intra-host, 4 crossing hosts\n"
            "  [0, 4]  crosses hosts (0, 1)\n"
            "  [1, 5]  crosses hosts (0, 1)\n"
            "  [2, 6]  crosses hosts (0, 1)\n"
            "  [3, 7]  crosses hosts (0, 1)\n"
            "\n"
            "ep (degree 2, carved from dp_shard x cp = 4, inner): token all-to-all to and from the "
            "experts (dispatch and combine)\n"
            "  4 groups of 2 ranks: 4 intra-host, 0 crossing hosts\n"
            "  [0, 2]  intra-host (host 0)\n"
            "  [1, 3]  intra-host (host 0)\n"
            "  [4, 6]  intra-host (host 1)\n"
            "  [5, 7]  intra-host (host 1)\n"
            "\n"
            "summary: 14 groups on 4 axes, 6 crossing hosts (dp_shard and efsdp)\n");
  // Without the carve the same mesh prints the same first sections, byte for byte.
  const std::string plain = describe_mesh(Mesh(8, degrees(1, 1, 4, 1, 2)), 4);
  EXPECT_EQ(text.rfind(plain.substr(0, plain.find("\nsummary")), 0), 0u) << plain;
  // A part of degree 1 gets no section: ep 1 leaves efsdp = dp_shard x cp, ep 4 leaves ep.
  const std::string ep1 = describe_mesh(with_ep(8, degrees(1, 1, 4, 1, 2), 1), 4);
  EXPECT_EQ(ep1.find("\nep ("), std::string::npos) << ep1;
  EXPECT_NE(ep1.find("\nefsdp (degree 4, carved from dp_shard x cp = 4, outer)"), std::string::npos)
      << ep1;
  const std::string ep4 = describe_mesh(with_ep(8, degrees(1, 1, 4, 1, 2), 4), 4);
  EXPECT_EQ(ep4.find("\nefsdp ("), std::string::npos) << ep4;
  EXPECT_NE(ep4.find("\nep (degree 4, carved from dp_shard x cp = 4, inner)"), std::string::npos)
      << ep4;
  // Any other carve is listed too, under its own names.
  Mesh other(8, degrees(1, 1, 4, 1, 2));
  other.carve("x", 2, {Axis::dp_shard}, "y");
  const std::string x = describe_mesh(other, 4);
  EXPECT_NE(x.find("\ny (degree 2, carved from dp_shard = 4, outer): a carved axis: no collective "
                   "of cleave runs on it\n"),
            std::string::npos)
      << x;
}

}  // namespace
}  // namespace cleave
