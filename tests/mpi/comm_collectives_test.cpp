// Every collective against a reference computed locally from deterministic per-rank inputs: fp32
// and bf16, cleave's ring and MPI's, in place and out of place, sizes not divisible by the group.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "cleave/base/check.h"
#include "comm_test_util.h"

namespace cleave::test {
namespace {

const int64_t kCounts[] = {0, 1, 7, 1000003};
const CommType kTypes[] = {CommType::f32, CommType::bf16};
const CommAlgo kAlgos[] = {CommAlgo::ours, CommAlgo::mpi, CommAlgo::fastest};

std::string label(const char* op, CommType t, CommAlgo a, int64_t count, const char* extra = "") {
  std::ostringstream s;
  s << op << " " << type_name(t) << " " << algo_name(a) << " count " << count << extra;
  return s.str();
}

TEST(Collectives, AllReduce) {
  Group& g = world();
  for (CommType t : kTypes)
    for (CommAlgo a : kAlgos)
      for (int64_t count : kCounts) {
        std::vector<char> buf = make_input(t, g.rank(), 0, count);
        const double blocked = g.all_reduce(buf.data(), count, t, a).wait();
        EXPECT_GE(blocked, 0);
        expect_elements(t, buf, count, [&](int64_t i) { return reference_sum(t, g.size(), i); },
                        label("all_reduce", t, a, count));
      }
}

// bf16 is summed in fp32 and rounded once: 1 + (n-1) * 3*2^-9 rounds up to the next bf16 after 1
// once n >= 3 (0.75 ulp), while rounding after each addition would stay at 1.
TEST(Collectives, AllReduceBf16RoundsOnce) {
  Group& g = world();
  for (CommAlgo a : kAlgos) {
    const int64_t count = 1000;
    std::vector<uint16_t> buf(count, to_bf16(g.rank() == 0 ? 1.0f : 3.0f / 512));
    g.all_reduce(buf.data(), count, CommType::bf16, a).wait();
    const float exact = 1.0f + float(g.size() - 1) * 3.0f / 512;
    for (int64_t i = 0; i < count; i += 97)
      EXPECT_EQ(from_bf16(buf[size_t(i)]), from_bf16(to_bf16(exact))) << algo_name(a) << " " << i;
  }
}

// Random data (sums not exact): the same all_reduce twice gives bitwise the same result on every
// rank, and ours agrees with MPI's to rounding.
TEST(Collectives, AllReduceDeterministic) {
  Group& g = world();
  const int64_t count = 300007;
  std::vector<float> input(count);
  uint64_t s = 0x9e3779b97f4a7c15ull * uint64_t(g.rank() + 1);
  for (float& x : input) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = std::ldexp(float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23), int(s >> 20 & 15) - 8);
  }
  std::vector<float> result[2][2];  // [algo][run]
  for (int ai = 0; ai < 2; ++ai)
    for (int run = 0; run < 2; ++run) {
      result[ai][run] = input;
      g.all_reduce(result[ai][run].data(), count, CommType::f32,
                   ai == 0 ? CommAlgo::ours : CommAlgo::mpi)
          .wait();
    }
  for (int ai = 0; ai < 2; ++ai)
    EXPECT_EQ(0, std::memcmp(result[ai][0].data(), result[ai][1].data(), size_t(count) * 4))
        << (ai == 0 ? "ours" : "mpi") << " is not deterministic";
  // Every rank holds the same bits: compare a checksum across ranks.
  uint64_t h = 0;
  for (float x : result[0][0]) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    h = h * 1099511628211ull ^ u;
  }
  std::vector<uint64_t> all(size_t(g.size()));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (uint64_t x : all) EXPECT_EQ(x, h) << "ranks disagree on the all_reduce result";
  // |input| < 2^7: n additions in any order differ by at most about n * 2^7 * 2^-24 each.
  const float tolerance = float(g.size()) * 128.0f * std::ldexp(1.0f, -22);
  for (int64_t i = 0; i < count; ++i) {
    const float a = result[0][0][size_t(i)], b = result[1][0][size_t(i)];
    if (std::fabs(a - b) > tolerance) {
      ADD_FAILURE() << "ours and mpi differ at " << i << ": " << a << " vs " << b;
      break;
    }
  }
}

TEST(Collectives, AllGather) {
  Group& g = world();
  const int n = g.size();
  for (CommType t : kTypes)
    for (CommAlgo a : kAlgos)
      for (int64_t count : kCounts)
        for (bool in_place : {false, true}) {
          const size_t ts = t == CommType::f32 ? 4 : 2;
          std::vector<char> mine = make_input(t, g.rank(), 0, count);
          std::vector<char> recv(size_t(count * n) * ts, 0);
          const void* send = mine.data();
          if (in_place) {
            // copy_n, not memcpy: count 0 leaves both vectors without storage (data() is null).
            std::copy_n(mine.data(), mine.size(), recv.data() + size_t(g.rank() * count) * ts);
            send = recv.data() + size_t(g.rank() * count) * ts;
          }
          g.all_gather(send, recv.data(), count, t, a).wait();
          expect_elements(t, recv, count * n,
                          [&](int64_t i) { return value(int(i / count), i % count); },
                          label("all_gather", t, a, count, in_place ? " in place" : ""));
        }
}

TEST(Collectives, ReduceScatter) {
  Group& g = world();
  const int n = g.size();
  for (CommType t : kTypes)
    for (CommAlgo a : kAlgos)
      for (int64_t count : kCounts)
        for (bool in_place : {false, true}) {
          const size_t ts = t == CommType::f32 ? 4 : 2;
          std::vector<char> send = make_input(t, g.rank(), 0, count * n);
          std::vector<char> out(size_t(count) * ts);
          void* recv = in_place ? send.data() + size_t(g.rank() * count) * ts : out.data();
          g.reduce_scatter(send.data(), recv, count, t, a).wait();
          if (in_place) std::copy_n(static_cast<const char*>(recv), out.size(), out.data());
          expect_elements(t, out, count,
                          [&](int64_t i) { return reference_sum(t, n, g.rank() * count + i); },
                          label("reduce_scatter", t, a, count, in_place ? " in place" : ""));
        }
}

TEST(Collectives, BroadcastFromLastRank) {
  Group& g = world();
  const int root = g.size() - 1;
  for (CommType t : kTypes)
    for (int64_t count : kCounts) {
      std::vector<char> buf = make_input(t, g.rank(), 0, count);
      g.broadcast(buf.data(), count, t, root).wait();
      expect_elements(t, buf, count, [&](int64_t i) { return value(root, i); },
                      label("broadcast", t, CommAlgo::mpi, count));
    }
}

TEST(Collectives, AllToAll) {
  Group& g = world();
  const int n = g.size();
  for (CommType t : kTypes)
    for (int64_t count : {int64_t(0), int64_t(1), int64_t(7), int64_t(100003)}) {
      // block `to` of rank r: value(r, to * count + i)
      std::vector<char> send = make_input(t, g.rank(), 0, count * n);
      std::vector<char> recv(send.size());
      g.all_to_all(send.data(), recv.data(), count, t).wait();
      auto expected = [&](int64_t i) { return value(int(i / count), g.rank() * count + i % count); };
      expect_elements(t, recv, count * n, expected, label("all_to_all", t, CommAlgo::mpi, count));
      g.all_to_all(send.data(), send.data(), count, t).wait();  // in place
      expect_elements(t, send, count * n, expected,
                      label("all_to_all", t, CommAlgo::mpi, count, " in place"));
    }
}

// Uneven blocks, some empty: rank r sends c(r, to) elements to `to`.
TEST(Collectives, AllToAllvUneven) {
  Group& g = world();
  const int n = g.size(), me = g.rank();
  auto c = [](int from, int to) -> int64_t {
    const int64_t k = (from + 2 * to) % 3;  // 0 for some pairs
    return k == 0 ? 0 : k == 1 ? 7 : 100003;
  };
  for (CommType t : kTypes) {
    std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    int64_t stotal = 0, rtotal = 0;
    for (int p = 0; p < n; ++p) {
      sc[size_t(p)] = c(me, p);
      rc[size_t(p)] = c(p, me);
      stotal += sc[size_t(p)];
      rtotal += rc[size_t(p)];
    }
    // element j of the block for `to`: value(me, to * 1000000 + j)
    std::vector<char> send;
    for (int p = 0; p < n; ++p) {
      std::vector<char> b = make_input(t, me, int64_t(p) * 1000000, sc[size_t(p)]);
      send.insert(send.end(), b.begin(), b.end());
    }
    std::vector<char> recv(size_t(rtotal) * (t == CommType::f32 ? 4 : 2));
    g.all_to_allv(send.data(), sc, recv.data(), rc, t).wait();
    std::vector<std::pair<int, int64_t>> origin;  // recv element -> (from, j)
    for (int p = 0; p < n; ++p)
      for (int64_t j = 0; j < rc[size_t(p)]; ++j) origin.push_back({p, j});
    expect_elements(t, recv, rtotal,
                    [&](int64_t i) {
                      return value(origin[size_t(i)].first,
                                   int64_t(me) * 1000000 + origin[size_t(i)].second);
                    },
                    std::string("all_to_allv ") + type_name(t));
  }
}

// Rank r's c(r) elements (none on some ranks) at the last rank, in rank order: floats, and int64s
// whose bits a float could not carry; the broadcast carries int64s whole too, and no reduction
// takes them.
TEST(Collectives, GathervAtRootAndInt64Bits) {
  Group& g = world();
  const int n = g.size(), me = g.rank(), root = n - 1;
  auto c = [](int r) -> int64_t { return r % 3 == 1 ? 0 : 5 * r + 3; };
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int r = 0; r < n; ++r) counts.push_back(c(r)), total += c(r);
  auto big = [](int r, int64_t i) { return (int64_t(r + 1) << 40) + 3 * i + 1; };
  std::vector<int64_t> mine, all(size_t(total), -1);
  for (int64_t i = 0; i < c(me); ++i) mine.push_back(big(me, i));
  g.gatherv(mine.data(), c(me), me == root ? all.data() : nullptr, counts, CommType::i64, root).wait();
  std::vector<float> mine_f, all_f(size_t(total), -1.f);
  for (int64_t i = 0; i < c(me); ++i) mine_f.push_back(float(value(me, i)));
  g.gatherv(mine_f.data(), c(me), me == root ? all_f.data() : nullptr, counts, CommType::f32, root)
      .wait();
  if (me == root) {
    int64_t at = 0;
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < c(r); ++i, ++at) {
        EXPECT_EQ(all[size_t(at)], big(r, i)) << "gatherv i64, rank " << r << " element " << i;
        EXPECT_EQ(all_f[size_t(at)], float(value(r, i))) << "gatherv f32, rank " << r << " element " << i;
      }
  }
  std::vector<int64_t> head(7);
  for (int64_t i = 0; i < 7; ++i) head[size_t(i)] = me == root ? big(root, i) : 0;
  g.broadcast(head.data(), 7, CommType::i64, root).wait();
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(head[size_t(i)], big(root, i)) << "broadcast i64 " << i;
  EXPECT_THROW(g.all_reduce(head.data(), 7, CommType::i64), Error);
  // A rank whose count disagrees with the counts is refused before anything is sent.
  EXPECT_THROW(g.gatherv(mine.data(), c(me) + 1, all.data(), counts, CommType::i64, root), Error);
}

TEST(Collectives, Barrier) {
  for (int i = 0; i < 3; ++i) EXPECT_GE(world().barrier().wait(), 0);
}

}  // namespace
}  // namespace cleave::test
