// Cluster files: a cluster written and read back is the same; every kind of bad file is refused
// naming the file, the line and the key; the GEMM model is exact on its grid, monotonic, clamped
// and capped by the peak; the collective model counts bytes as the trainer does; the alpha-beta
// fit recovers exact synthetic figures; the shipped cluster files read.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "cleave/base/check.h"
#include "cleave/comm/group.h"
#include "cleave/plan/cluster.h"

namespace cleave {
namespace {

// A grid over {64, 512} x {128, 1024} x {256, 2048}: rates grow with size, 70 to 100 GF/s.
std::vector<GemmPoint> grid_points() {
  std::vector<GemmPoint> points;
  for (int64_t m : {64, 512})
    for (int64_t n : {128, 1024})
      for (int64_t k : {256, 2048})
        points.push_back({m, n, k, 10.0 * std::log2(double(m * n * k)) / 3.0});
  return points;
}

Cluster sample_cluster() {
  Cluster c;
  c.name = "sample";
  c.source = "unit test \"quoted\"";
  c.devices_per_host = 8;
  c.memory_gib = 80;
  c.memory_gbps = 3350.5;
  c.attention_dtype = Precision::bf16;
  c.elementwise_gbps = 1500.5;
  c.pack_gbps = 700;
  c.fp8_gbps = 333.25;
  c.refault_gbps = 0.125;
  c.refault_huge_gbps = 1.5;
  c.compute_imbalance = 1.125;
  c.attention = {{128, 50.5}, {2048, 80}};
  c.peak_gflops[Precision::fp32] = 100;
  c.peak_gflops[Precision::bf16] = 989000.25;
  c.gemm[Precision::fp32] = GemmTable(grid_points(), "test");
  LinkCosts intra;
  for (Collective k : kCollectives) intra[size_t(k)] = {{2.5 + int(k), 360.0 - int(k)}};
  // A second, slower regime from 8 MiB on.
  intra[size_t(Collective::all_gather)].push_back({0.0, 100.0, int64_t(8) << 20});
  c.links[size_t(LinkClass::intra_host)] = intra;
  c.compute_slowdown[size_t(LinkClass::intra_host)] = 0.25;
  return c;
}

std::string error_of(const std::string& text) {
  try {
    parse_cluster(text, "bad.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = R"([cluster]
name = "m"
source = "s"
devices_per_host = 2
memory_gib = 8
memory_gbps = 10
attention_dtype = "fp32"
[peak_gflops]
fp32 = 50
bf16 = "unknown"
fp16 = "unknown"
fp8 = "unknown"
)";

// kMinimal with `line` appended.
std::string minimal_with(const std::string& more) { return std::string(kMinimal) + more; }

const char* kLink = R"(
[collectives.intra_host]
all_reduce = { alpha_us = 5, beta_gbps = 4 }
all_gather = { alpha_us = 5, beta_gbps = 4 }
reduce_scatter = { alpha_us = 5, beta_gbps = 4 }
all_to_all = { alpha_us = 5, beta_gbps = 4 }
send_recv = { alpha_us = 5, beta_gbps = 4 }
compute_slowdown = 0.5
)";

TEST(Cluster, RoundTrip) {
  const Cluster c = sample_cluster();
  const std::string text = cluster_toml(c, {{"", "top\nsecond line"},
                                            {"gemm.fp32", "measured"},
                                            {"collectives.inter_host", "not measured"}});
  EXPECT_NE(text.find("# top\n# second line\n[cluster]"), std::string::npos) << text;
  EXPECT_NE(text.find("# not measured\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("[collectives.inter_host]"), std::string::npos) << text;
  const Cluster back = parse_cluster(text, "written.toml");
  EXPECT_EQ(cluster_toml(back), cluster_toml(c));
  EXPECT_EQ(back.name, "sample");
  EXPECT_EQ(back.source, c.source);
  EXPECT_EQ(back.devices_per_host, 8);
  EXPECT_EQ(back.memory_gbps, 3350.5);
  EXPECT_EQ(back.attention_dtype, Precision::bf16);
  EXPECT_EQ(back.elementwise_gbps, 1500.5);
  EXPECT_EQ(back.pack_gbps, 700);
  EXPECT_EQ(back.fp8_gbps, 333.25);
  EXPECT_EQ(back.refault_gbps, 0.125);
  EXPECT_EQ(back.refault_huge_gbps, 1.5);
  EXPECT_EQ(back.compute_imbalance, 1.125);
  EXPECT_DOUBLE_EQ(refault_seconds(back, 3e9, true), 2.0);
  EXPECT_DOUBLE_EQ(refault_seconds(back, 0.25e9, false), 2.0);
  ASSERT_EQ(back.attention.size(), 2u);
  EXPECT_EQ(back.attention[1].keys, 2048);
  EXPECT_EQ(back.attention[0].gflops, 50.5);
  EXPECT_NE(text.find("[attention]\nrates = [\n  { keys = 128, gflops = 50.5 },\n"), std::string::npos)
      << text;
  EXPECT_EQ(back.peak_gflops.at(Precision::bf16), 989000.25);
  EXPECT_FALSE(back.peak_gflops.count(Precision::fp8));
  EXPECT_EQ(back.gemm.at(Precision::fp32).points().size(), 8u);
  EXPECT_FALSE(back.links[size_t(LinkClass::inter_host)].has_value());
  const LinkCosts& intra = *back.links[size_t(LinkClass::intra_host)];
  EXPECT_EQ(intra[size_t(Collective::send_recv)][0].alpha_us, 6.5);
  EXPECT_EQ(back.compute_slowdown[size_t(LinkClass::intra_host)], 0.25);
  ASSERT_EQ(intra[size_t(Collective::all_gather)].size(), 2u);
  EXPECT_EQ(intra[size_t(Collective::all_gather)][1].from_bytes, int64_t(8) << 20);
  EXPECT_NE(text.find("all_gather = [\n  { alpha_us = 3.5, beta_gbps = 359.0 },\n"
                      "  { from_bytes = 8388608, alpha_us = 0.0, beta_gbps = 100.0 },\n]"),
            std::string::npos) << text;
  // A comment for a part the file does not have is a mistake of the writer's caller.
  EXPECT_THROW(cluster_toml(c, {{"gemm.fp64", "x"}}), Error);
}

TEST(Cluster, RefusesUnknownKeysNamingFileLineAndKey) {
  EXPECT_EQ(error_of(minimal_with("[network]\nx = 1\n")),
            "bad.toml:13: unknown key 'network' (did you mean 'gemm'?)");
  EXPECT_EQ(error_of(std::string(kMinimal).replace(0, 9, "[cluster]\nmemroy_gib = 3")),
            "bad.toml:2: unknown key 'cluster.memroy_gib' (did you mean 'cluster.memory_gib'?)");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp64 = []\n")),
            "bad.toml:14: unknown key 'gemm.fp64' (did you mean 'gemm.fp32'?)");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = [{ m = 1, n = 1, k = 1, glops = 3 }]\n")),
            "bad.toml:14: unknown key 'gemm.fp32[0].glops' (did you mean 'gemm.fp32[0].gflops'?)");
  EXPECT_EQ(error_of(minimal_with("[collectives.intra_hots]\n")),
            "bad.toml:13: unknown key 'collectives.intra_hots' (did you mean "
            "'collectives.intra_host'?)");
  std::string link = kLink;
  link.replace(link.find("send_recv"), 9, "send_recieve");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:19: unknown key 'collectives.intra_host.send_recieve' (did you mean "
            "'collectives.intra_host.send_recv'?)");
  link = kLink;
  link.replace(link.find("compute_slowdown"), 22, "");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:14: collectives.intra_host.compute_slowdown is missing");
  link = kLink;
  link.replace(link.find("compute_slowdown = 0.5"), 22, "compute_slowdown = -1.5");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:20: collectives.intra_host.compute_slowdown = -1.5 is out of range [0, 100]");
  link = kLink;
  link.replace(link.find("all_gather = {"), link.find("\nreduce_scatter") - link.find("all_gather"),
               "all_gather = [{ from_bytes = 1, alpha_us = 5, beta_gbps = 4 }]");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:16: collectives.intra_host.all_gather[0].from_bytes: the first line applies "
            "from 0 bytes on and takes no from_bytes");
  link = kLink;
  link.replace(link.find("beta_gbps"), 9, "bandwidth");
  EXPECT_NE(error_of(minimal_with(link)).find("bad.toml:15: unknown key "
                                              "'collectives.intra_host.all_reduce.bandwidth'"),
            std::string::npos);
}

TEST(Cluster, RefusesValuesOutOfRangeAndMissingKeys) {
  std::string t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("memory_gib = 8"), 14, "memory_gib = -8")),
            "bad.toml:5: cluster.memory_gib = -8 is out of range [1e-06, 1000000000]");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("devices_per_host = 2"), 20, "devices_per_host = 2.5")),
            "bad.toml:4: cluster.devices_per_host must be an integer, got floating-point 2.5");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("bf16 = \"unknown\""), 16, "bf16 = \"n/a\"")),
            "bad.toml:10: peak_gflops.bf16 = \"n/a\" must be a number (GF/s) or \"unknown\"");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("fp32 = 50"), 9, "fp32 = 0")),
            "bad.toml:9: peak_gflops.fp32 = 0 is out of range [1e-06, 1e+12]");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("fp8 = \"unknown\"\n"), 16, "")),
            "bad.toml:8: peak_gflops.fp8 is missing");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("memory_gbps = 10\n"), 17, "")),
            "bad.toml:1: cluster.memory_gbps is missing");
  EXPECT_EQ(error_of("[peak_gflops]\n"), "bad.toml: [cluster] is missing");
  // The measured kernel rates may be left out: the streaming bandwidth and the GEMM table of
  // attention_dtype stand in for them, and a file written without them has none.
  const Cluster minimal = parse_cluster(kMinimal, "minimal.toml");
  EXPECT_EQ(minimal.elementwise_gbps, 0);
  EXPECT_EQ(minimal.pack_gbps, 0);
  EXPECT_EQ(minimal.fp8_gbps, 0);
  EXPECT_TRUE(minimal.attention.empty());
  EXPECT_EQ(cluster_toml(minimal).find("elementwise_gbps"), std::string::npos);
  EXPECT_EQ(cluster_toml(minimal).find("fp8_gbps"), std::string::npos);
  // FP8's kernels fall back to the element-wise rate, that to the streaming bandwidth.
  EXPECT_DOUBLE_EQ(fp8_seconds(minimal, 1e9), memory_seconds(minimal, 1e9));
  // Without compute_imbalance the devices compute alike; below 1 it would make ranks that wait
  // for each other faster than each alone.
  EXPECT_EQ(minimal.compute_imbalance, 0.0);
  EXPECT_EQ(cluster_toml(minimal).find("compute_imbalance"), std::string::npos);
  EXPECT_EQ(elementwise_seconds(minimal, 20e9), 2.0);
  EXPECT_EQ(pack_seconds(minimal, 20e9), 0.0);
  EXPECT_EQ(refault_seconds(minimal, 20e9, false), 0.0);
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("memory_gbps = 10\n"), 17,
                               "memory_gbps = 10\npack_gbps = 0\n")),
            "bad.toml:7: cluster.pack_gbps = 0 is out of range [1e-06, 1e+12]");
  t = kMinimal;
  EXPECT_EQ(error_of(t.replace(t.find("memory_gbps = 10\n"), 17,
                               "memory_gbps = 10\ncompute_imbalance = 0.9\n")),
            "bad.toml:7: cluster.compute_imbalance = 0.9 is out of range [1, 100]");
  EXPECT_EQ(error_of(minimal_with("[attention]\nrates = [{ keys = 512, gflops = 3 },\n"
                                  "{ keys = 128, gflops = 4 }]\n")),
            "bad.toml:15: attention.rates[1].keys = 128 must be larger than the point before it "
            "(512)");
  EXPECT_EQ(error_of(minimal_with("[attention]\nrates = [{ keys = 512 }]\n")),
            "bad.toml:14: attention.rates[0].gflops is missing");
  EXPECT_EQ(error_of(minimal_with("[attention]\nrate = []\n")),
            "bad.toml:14: unknown key 'attention.rate' (did you mean 'attention.rates'?)");
  EXPECT_EQ(error_of(minimal_with("[attention]\nrates = []\n")),
            "bad.toml:14: attention.rates has no points");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = [{ m = 0, n = 1, k = 1, gflops = 3 }]\n")),
            "bad.toml:14: gemm.fp32[0].m = 0 is out of range [1, 1073741824]");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = [{ m = 4, n = 1, gflops = 3 }]\n")),
            "bad.toml:14: gemm.fp32[0].k is missing");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = []\n")), "bad.toml:14: gemm.fp32 has no points");
  std::string link = kLink;
  link.replace(link.find("alpha_us = 5"), 12, "alpha_us = -1");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:15: collectives.intra_host.all_reduce.alpha_us = -1 is out of range [0, "
            "1000000000]");
  link = kLink;
  link.replace(link.find("all_gather = {"), link.find("\nreduce_scatter") - link.find("all_gather"),
               "all_gather = [{ alpha_us = 5, beta_gbps = 4 }, { alpha_us = 5, beta_gbps = 1 }]");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:16: collectives.intra_host.all_gather[1].from_bytes is missing");
  link = kLink;
  link.replace(link.find("all_gather = {"), link.find("\nreduce_scatter") - link.find("all_gather"),
               "all_gather = [{ alpha_us = 5, beta_gbps = 4 }, { from_bytes = 9, alpha_us = 5, "
               "beta_gbps = 1 },\n{ from_bytes = 9, alpha_us = 5, beta_gbps = 1 }]");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:17: collectives.intra_host.all_gather[2].from_bytes = 9 must exceed the "
            "line before's");
  link = kLink;
  link.replace(link.find("all_gather = {"), link.find("\nreduce_scatter") - link.find("all_gather"),
               "all_gather = []");
  EXPECT_EQ(error_of(minimal_with(link)), "bad.toml:16: collectives.intra_host.all_gather has no lines");
  link = kLink;
  link.replace(link.find("all_to_all"), link.find("send_recv") - link.find("all_to_all"), "");
  EXPECT_EQ(error_of(minimal_with(link)),
            "bad.toml:14: collectives.intra_host.all_to_all is missing");
  EXPECT_EQ(error_of(minimal_with(kLink)), "");
  EXPECT_EQ(error_of("[cluster\n").substr(0, 28), "bad.toml:1: TOML syntax erro");
}

TEST(Cluster, RefusesGemmTablesThatAreNoGrid) {
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = [{ m = 1, n = 1, k = 1, gflops = 3 },\n"
                                  "{ m = 2, n = 2, k = 1, gflops = 3 }]\n")),
            "bad.toml:14: gemm.fp32: the shapes are no full grid: m=1 n=2 k=1 is missing (each m "
            "listed must appear with every n and every k)");
  EXPECT_EQ(error_of(minimal_with("[gemm]\nfp32 = [{ m = 1, n = 1, k = 1, gflops = 3 },\n"
                                  "{ m = 1, n = 1, k = 1, gflops = 4 }]\n")),
            "bad.toml:14: gemm.fp32: m=1 n=1 k=1 is listed twice");
}

TEST(Cluster, ReadClusterNamesAMissingFile) {
  try {
    read_cluster("/nonexistent/cluster.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/cluster.toml"), std::string::npos);
  }
}

double rate(const GemmTable& t, int64_t m, int64_t n, int64_t k, double peak = 0) {
  return 2.0 * double(m) * double(n) * double(k) / t.seconds(m, n, k, peak) * 1e-9;
}

TEST(GemmModel, ExactOnTheGridAndBetweenItsPoints) {
  const GemmTable t(grid_points(), "test");
  for (const GemmPoint& p : grid_points()) EXPECT_NEAR(rate(t, p.m, p.n, p.k), p.gflops, 1e-9);
  // Halfway in log m between two points whose rates differ: the time is their geometric mean.
  const double lo = t.seconds(64, 128, 256, 0), hi = t.seconds(512, 128, 256, 0);
  EXPECT_NEAR(t.seconds(181, 128, 256, 0) / std::sqrt(lo * hi), 1.0, 2e-3);
}

TEST(GemmModel, MonotonicClampedAndCappedByThePeak) {
  // Noisy points: the larger m = 512 measured "faster in time" than m = 64 at one shape.
  std::vector<GemmPoint> points = grid_points();
  for (GemmPoint& p : points)
    if (p.m == 512 && p.n == 128 && p.k == 256) p.gflops = 1e6;
  const GemmTable t(points, "test");
  // The time grows with each dimension, over the grid and beyond it.
  for (int d = 0; d < 3; ++d) {
    double previous = 0;
    for (double x = 8; x < 20000; x *= 1.07) {
      int64_t dims[3] = {200, 300, 400};
      dims[d] = int64_t(x);
      const double s = t.seconds(dims[0], dims[1], dims[2], 0);
      EXPECT_GE(s, previous) << "dimension " << d << " = " << dims[d];
      previous = s;
    }
  }
  // Beyond the grid the rate is that of the nearest grid point.
  EXPECT_NEAR(rate(t, 100000, 1024, 2048), rate(t, 512, 1024, 2048), 1e-9);
  EXPECT_NEAR(rate(t, 1, 1, 1), rate(t, 64, 128, 256), 1e-9);
  EXPECT_NEAR(rate(t, 100000, 1, 1000), rate(t, 512, 128, 1000), 1e-9);
  // Never above the peak.
  EXPECT_NEAR(rate(t, 512, 1024, 2048, 50.0), 50.0, 1e-9);
  EXPECT_NEAR(rate(t, 64, 128, 256, 1e9), 70.0, 1e-9);  // a peak above the rate changes nothing
  EXPECT_EQ(t.seconds(0, 10, 10, 0), 0.0);

  Cluster c = sample_cluster();
  c.peak_gflops[Precision::fp32] = 40;
  EXPECT_NEAR(2.0 * 512 * 1024 * 2048 / gemm_seconds(c, 512, 1024, 2048, Precision::fp32) * 1e-9,
              40.0, 1e-9);
  try {
    gemm_seconds(c, 1, 1, 1, Precision::fp8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cluster 'sample' has no fp8 GEMM table (gemm.fp8)");
  }
}

TEST(AttentionModel, InterpolatesInLogKeysAndHoldsBeyondThePoints) {
  Cluster c = sample_cluster();
  c.attention = {{64, 10}, {256, 40}};
  auto rate = [&](int64_t keys) { return 2.0 * 8 * keys * 64 / attention_seconds(c, 8, keys, 64) / 1e9; };
  EXPECT_NEAR(rate(64), 10, 1e-9);
  EXPECT_NEAR(rate(128), 20, 1e-9);
  EXPECT_NEAR(rate(256), 40, 1e-9);
  EXPECT_NEAR(rate(16), 10, 1e-9);
  EXPECT_NEAR(rate(4096), 40, 1e-9);
  EXPECT_EQ(attention_seconds(c, 0, 128, 64), 0);
  // Without rates, the GEMM table of attention_dtype.
  c.attention.clear();
  c.attention_dtype = Precision::fp32;
  EXPECT_EQ(attention_seconds(c, 64, 128, 256), gemm_seconds(c, 64, 128, 256, Precision::fp32));
}

TEST(CollectiveModel, CountsBytesAsTheTrainerDoes) {
  for (int p : {2, 3, 4, 8}) {
    const int64_t n = 3 * 1024 * 1024;  // floats, divisible by every p here
    EXPECT_EQ(ring_bytes_sent(Collective::all_reduce, double(n * 4), p),
              double(ring_all_reduce_bytes(n * 4, p)));
    EXPECT_EQ(ring_bytes_sent(Collective::all_gather, double(n * 4), p),
              double(ring_gather_bytes(n * 4 / p, p)));
    EXPECT_EQ(ring_bytes_sent(Collective::reduce_scatter, double(n * 4), p),
              double(ring_gather_bytes(n * 4 / p, p)));
    EXPECT_EQ(ring_steps(Collective::all_reduce, p), 2 * (p - 1));
    EXPECT_EQ(ring_steps(Collective::all_to_all, p), p - 1);
    EXPECT_EQ(ring_steps(Collective::send_recv, p), 1);
  }
  const Cluster c = sample_cluster();
  // all_reduce on intra_host: alpha 2.5 us, beta 360 GB/s; 4 ranks, 1 GB: 6 steps, 1.5 GB sent.
  EXPECT_NEAR(collective_seconds(c, Collective::all_reduce, LinkClass::intra_host, 1e9, 4),
              6 * 2.5e-6 + 1.5e9 / 360e9, 1e-15);
  EXPECT_EQ(collective_seconds(c, Collective::all_reduce, LinkClass::intra_host, 1e9, 1), 0.0);
  try {
    collective_seconds(c, Collective::all_reduce, LinkClass::inter_host, 1e9, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cluster 'sample' does not describe its inter_host links (collectives.inter_host)");
  }
  EXPECT_NEAR(memory_seconds(c, 3350.5e9), 1.0, 1e-12);
}

TEST(CollectiveModel, TheLongestApplicableLineCounts) {
  Cluster c = sample_cluster();
  // all_gather: 3.5 us per step at 359 GB/s; from 8 MiB on also 100 GB/s without latency.
  const auto at = [&](double bytes) {
    return collective_seconds(c, Collective::all_gather, LinkClass::intra_host, bytes, 4);
  };
  EXPECT_NEAR(at(4 << 20), 3 * 3.5e-6 + 0.75 * (4 << 20) / 359e9, 1e-15);
  EXPECT_NEAR(at(16 << 20), 0.75 * (16 << 20) / 100e9, 1e-15);
  double previous = 0;
  for (double bytes = 1024; bytes < 1e9; bytes *= 1.1) {
    EXPECT_GE(at(bytes), previous) << bytes;
    previous = at(bytes);
  }
}

TEST(CollectiveModel, FitRecoversAlphaAndBetaFromExactPoints) {
  for (Collective kind : kCollectives)
    for (int p : {2, 4, 16}) {
      Cluster truth;
      truth.name = "truth";
      LinkCosts costs;
      costs[size_t(kind)] = {{7.25, 3.5}};
      truth.links[size_t(LinkClass::intra_host)] = costs;
      std::vector<CommPoint> points;
      for (double bytes = 4096; bytes <= 256e6; bytes *= 4)
        points.push_back(
            {bytes, collective_seconds(truth, kind, LinkClass::intra_host, bytes, p)});
      const AlphaBeta fit = fit_alpha_beta(kind, p, points);
      EXPECT_NEAR(fit.alpha_us, 7.25, 1e-9) << collective_name(kind) << " p=" << p;
      EXPECT_NEAR(fit.beta_gbps, 3.5, 1e-9) << collective_name(kind) << " p=" << p;
      // One line describes them: fit_collective keeps it.
      const CollectiveCost cost = fit_collective(kind, p, points);
      ASSERT_EQ(cost.size(), 1u);
      EXPECT_NEAR(cost[0].beta_gbps, 3.5, 1e-9);
      EXPECT_LT(relative_error(cost, kind, p, points), 1e-12);
    }
  // A fit whose line would cross zero above the origin keeps alpha at 0.
  const AlphaBeta through_origin = fit_alpha_beta(
      Collective::send_recv, 2, {{1000, 0.5e-6}, {2000, 1.6e-6}, {4000, 3.8e-6}});
  EXPECT_EQ(through_origin.alpha_us, 0.0);
  EXPECT_GT(through_origin.beta_gbps, 0.0);
  // Times that shrink with size (noise): no latency, and the largest message's own rate.
  const AlphaBeta noisy = fit_alpha_beta(Collective::all_reduce, 2, {{1000, 2e-6}, {2000, 1e-6}});
  EXPECT_EQ(noisy.alpha_us, 0.0);
  EXPECT_NEAR(noisy.beta_gbps, ring_bytes_sent(Collective::all_reduce, 2000, 2) / 1e-6 / 1e9, 1e-9);
  EXPECT_THROW(fit_alpha_beta(Collective::all_reduce, 2, {{1000, 2e-6}, {1000, 3e-6}}), Error);
}

TEST(CollectiveModel, FitFindsASlowerRegimeOfLargeSizes) {
  // Up to 4 MiB 10 us per step at 8 GB/s; from 16 MiB on 2 GB/s (out of the cache), 30 us.
  Cluster truth;
  truth.name = "truth";
  LinkCosts costs;
  costs[size_t(Collective::all_reduce)] = {{10, 8}, {30, 2, int64_t(6) << 20}};
  truth.links[size_t(LinkClass::intra_host)] = costs;
  std::vector<CommPoint> points;
  for (double bytes = 4096; bytes <= 64 << 20; bytes *= 2)
    points.push_back({bytes, collective_seconds(truth, Collective::all_reduce,
                                                LinkClass::intra_host, bytes, 2)});
  const CollectiveCost fit = fit_collective(Collective::all_reduce, 2, points);
  ASSERT_EQ(fit.size(), 2u);
  EXPECT_NEAR(fit[0].alpha_us, 10, 1e-6);
  EXPECT_NEAR(fit[0].beta_gbps, 8, 1e-6);
  EXPECT_NEAR(fit[1].alpha_us, 30, 1e-6);
  EXPECT_NEAR(fit[1].beta_gbps, 2, 1e-6);
  // Between the 4 MiB and the 8 MiB measured (the 8 MiB point is on the slow line already).
  EXPECT_GT(fit[1].from_bytes, 4 << 20);
  EXPECT_LT(fit[1].from_bytes, 8 << 20);
  EXPECT_LT(relative_error(fit, Collective::all_reduce, 2, points), 1e-9);
  EXPECT_GT(relative_error({fit_alpha_beta(Collective::all_reduce, 2, points)},
                           Collective::all_reduce, 2, points),
            0.3);
}

TEST(Cluster, ShippedFilesRead) {
  const std::filesystem::path dir = std::filesystem::path(CLEAVE_SOURCE_DIR) / "clusters";
  const Cluster h100 = read_cluster((dir / "h100_sxm_ib.toml").string());
  EXPECT_EQ(h100.devices_per_host, 8);
  EXPECT_EQ(h100.peak_gflops.at(Precision::bf16), 989e3);
  EXPECT_EQ(h100.peak_gflops.at(Precision::fp8), 1979e3);
  EXPECT_EQ(h100.peak_gflops.at(Precision::fp32), 67e3);
  EXPECT_EQ(h100.memory_gbps, 3350.0);
  for (LinkClass l : kLinkClasses) EXPECT_TRUE(h100.links[size_t(l)].has_value());
  // NVLink inside the node, InfiniBand across: a large all-reduce is several times faster inside.
  const double intra =
      collective_seconds(h100, Collective::all_reduce, LinkClass::intra_host, 1e9, 8);
  const double inter =
      collective_seconds(h100, Collective::all_reduce, LinkClass::inter_host, 1e9, 8);
  EXPECT_GT(inter / intra, 5.0);
  // A large bf16 product below the peak, an fp8 one faster.
  const double bf16 = gemm_seconds(h100, 8192, 8192, 8192, Precision::bf16);
  EXPECT_GT(bf16, 2.0 * 8192 * 8192 * 8192 / 989e12);
  EXPECT_LT(gemm_seconds(h100, 8192, 8192, 8192, Precision::fp8), bf16);

  // calibrate's files of the Zen 5 and the Xeon with AMX have the kernels' measured rates; on
  // AMX a large bf16 product runs faster than an fp32 one.
  for (const char* name : {"epyc_zen5_2core.toml", "xeon_amx_2core.toml"}) {
    SCOPED_TRACE(name);
    const Cluster measured = read_cluster((dir / name).string());
    EXPECT_GT(measured.elementwise_gbps, 0);
    EXPECT_GT(measured.pack_gbps, 0);
    EXPECT_EQ(measured.attention.size(), 3u);
    EXPECT_GT(measured.refault_gbps, 0);
    EXPECT_GT(measured.refault_huge_gbps, 0);
  }
  const Cluster amx = read_cluster((dir / "xeon_amx_2core.toml").string());
  EXPECT_LT(gemm_seconds(amx, 2048, 2048, 2048, Precision::bf16),
            gemm_seconds(amx, 2048, 2048, 2048, Precision::fp32));

  const Cluster cpu = read_cluster((dir / "epyc_zen3_2core.toml").string());
  EXPECT_EQ(cpu.devices_per_host, 2);
  EXPECT_TRUE(cpu.links[size_t(LinkClass::intra_host)].has_value());
  EXPECT_FALSE(cpu.links[size_t(LinkClass::inter_host)].has_value());
  EXPECT_GT(cpu.memory_gbps, 0);
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    EXPECT_GT(gemm_seconds(cpu, 1024, 1024, 1024, p), 0);
    EXPECT_TRUE(cpu.peak_gflops.count(p));
  }
}

}  // namespace
}  // namespace cleave
