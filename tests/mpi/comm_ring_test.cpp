// The ring's pipelining (chunks moving through the steps independently, bounded windows, the
// send-before-overwrite dependencies) under many geometries: tiny chunks and windows make every
// dependency bind; large counts with the default geometry run many chunks per block.
#include "cleave/comm/tasks.h"
#include "comm_test_util.h"

namespace cleave::test {
namespace {

// Runs all_reduce, reduce_scatter (in place and not) and all_gather with our ring on `count`
// elements and checks each against the reference.
void check_ring(int64_t count, const std::string& geometry) {
  Group& g = world();
  const int n = g.size(), me = g.rank();
  for (CommType t : {CommType::f32, CommType::bf16}) {
    const size_t ts = t == CommType::f32 ? 4 : 2;
    const std::string what = std::string(type_name(t)) + " count " + std::to_string(count) + " " + geometry;
    std::vector<char> buf = make_input(t, me, 0, count);
    g.all_reduce(buf.data(), count, t, CommAlgo::ours).wait();
    expect_elements(t, buf, count, [&](int64_t i) { return reference_sum(t, n, i); },
                    "all_reduce " + what);

    for (bool in_place : {false, true}) {
      std::vector<char> send = make_input(t, me, 0, count * n), out(size_t(count) * ts);
      void* recv = in_place ? send.data() + size_t(me * count) * ts : out.data();
      g.reduce_scatter(send.data(), recv, count, t, CommAlgo::ours).wait();
      if (in_place) std::memcpy(out.data(), recv, out.size());
      expect_elements(t, out, count, [&](int64_t i) { return reference_sum(t, n, me * count + i); },
                      std::string("reduce_scatter ") + (in_place ? "in place " : "") + what);
    }

    std::vector<char> mine = make_input(t, me, 0, count), all(size_t(count * n) * ts);
    g.all_gather(mine.data(), all.data(), count, t, CommAlgo::ours).wait();
    expect_elements(t, all, count * n, [&](int64_t i) { return value(int(i / count), i % count); },
                    "all_gather " + what);
  }
}

TEST(Ring, SmallChunksAndWindows) {
  struct Case {
    int64_t chunk, window;
    std::vector<int64_t> counts;
  };
  const Case cases[] = {{1, 1, {1, 7, 100}},
                        {1, 8, {5, 64}},
                        {7, 2, {7, 1000, 5003}},
                        {1000, 3, {999, 100003}},
                        {4096, 8, {300007}}};
  for (const Case& c : cases) {
    comm_detail::set_ring_geometry(c.chunk, c.window);
    for (int64_t count : c.counts)
      check_ring(count, "chunk " + std::to_string(c.chunk) + " window " + std::to_string(c.window));
  }
  comm_detail::reset_ring_geometry();
}

// The default geometry (1 MiB chunks, 8 in flight) with many chunks per block.
TEST(Ring, LargeCounts) { check_ring(5000011, "default geometry"); }

// The same ring all_reduce twice, in different geometries... and the same geometry twice: the
// chunking must not change the result (each element is summed in the same order whatever the
// chunk size), so results are bitwise equal across geometries too.
TEST(Ring, ResultDoesNotDependOnChunking) {
  Group& g = world();
  const int64_t count = 100003;
  std::vector<float> input(count);
  uint64_t s = 88172645463325252ull + uint64_t(g.rank());
  for (float& x : input) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = float(int64_t(s % 2000001) - 1000000) * 1e-3f;
  }
  std::vector<float> a = input, b = input;
  g.all_reduce(a.data(), count, CommType::f32, CommAlgo::ours).wait();
  comm_detail::set_ring_geometry(13, 3);
  g.all_reduce(b.data(), count, CommType::f32, CommAlgo::ours).wait();
  comm_detail::reset_ring_geometry();
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(count) * 4));
}

}  // namespace
}  // namespace cleave::test
