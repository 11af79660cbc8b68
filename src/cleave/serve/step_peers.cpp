#include "cleave/serve/step_peers.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <thread>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"

namespace cleave::serve {

namespace {

enum : int64_t { kStop = 0, kStep = 1 };

// A batch as int64s: T, sequences, logit rows, then tokens, positions, cache_rows, cache_past,
// each table's length, the tables, logit_rows.
void pack(const Batch& b, std::vector<int64_t>& v) {
  const size_t S = b.cache_past.size();
  v.insert(v.end(), {b.T, int64_t(S), int64_t(b.logit_rows.size())});
  v.insert(v.end(), b.tokens.begin(), b.tokens.end());
  v.insert(v.end(), b.positions.begin(), b.positions.end());
  v.insert(v.end(), b.cache_rows.begin(), b.cache_rows.end());
  v.insert(v.end(), b.cache_past.begin(), b.cache_past.end());
  for (const auto& t : b.cache_blocks) v.push_back(int64_t(t.size()));
  for (const auto& t : b.cache_blocks) v.insert(v.end(), t.begin(), t.end());
  v.insert(v.end(), b.logit_rows.begin(), b.logit_rows.end());
}

// The lanes' batches as one message: their count, then each one's length and the batch packed.
std::vector<int64_t> pack(const std::vector<Batch>& lanes) {
  std::vector<int64_t> v{int64_t(lanes.size())};
  for (const Batch& b : lanes) {
    const size_t at = v.size();
    v.push_back(0);
    pack(b, v);
    v[at] = int64_t(v.size() - at - 1);
  }
  return v;
}

// Each lane's packed batch in such a message.
std::vector<std::span<const int64_t>> lanes_of(const std::vector<int64_t>& v) {
  CLEAVE_CHECK(!v.empty() && v[0] > 0, "a server step without lanes");
  std::vector<std::span<const int64_t>> lanes;
  size_t at = 1;
  for (int64_t l = 0; l < v[0]; ++l) {
    CLEAVE_CHECK(at < v.size() && v[at] >= 3 && at + 1 + size_t(v[at]) <= v.size(),
                 "a server step of " << v.size() << " values cut short at lane " << l);
    lanes.emplace_back(v.data() + at + 1, size_t(v[at]));
    at += 1 + size_t(v[at]);
  }
  return lanes;
}

void unpack(std::span<const int64_t> v, Batch& b, std::vector<std::vector<int32_t>>& tables) {
  size_t at = 0;
  auto take = [&](size_t n) {
    CLEAVE_CHECK(at + n <= v.size(), "a server step's batch of " << v.size() << " values cut short");
    const int64_t* p = v.data() + at;
    at += n;
    return p;
  };
  const int64_t* head = take(3);
  const size_t T = size_t(head[0]), S = size_t(head[1]), L = size_t(head[2]);
  b.B = 1, b.T = int64_t(T);
  const int64_t* p = take(T);
  b.tokens.assign(p, p + T);
  p = take(T);
  b.positions.assign(p, p + T);
  p = take(S + 1);
  b.cache_rows.assign(p, p + S + 1);
  p = take(S);
  b.cache_past.assign(p, p + S);
  const int64_t* lengths = take(S);
  tables.resize(S);
  b.cache_blocks.clear();
  for (size_t s = 0; s < S; ++s) {
    p = take(size_t(lengths[s]));
    tables[s].assign(p, p + lengths[s]);
    b.cache_blocks.push_back(tables[s]);
  }
  p = take(L);
  b.logit_rows.assign(p, p + L);
}

// The head goes by MPI_Ibcast on MPI_COMM_WORLD (a nonblocking collective matches only its kind),
// so that the others can wait for it asleep and without a limit. Rank 0's send of it is polled
// up to the collectives' timeout: a stopped rank whose shared-memory queue is full holds it back
// (seen in a fresh Debian root), and the comm layer's watchdog does not see raw MPI. The payload
// follows at once through the steps' group, under the comm layer's timeout.
void send(int64_t kind, const std::vector<int64_t>& payload, const PeerGroups& g) {
  int64_t head[2] = {kind, int64_t(payload.size())};
  MPI_Request r;
  MPI_Ibcast(head, 2, MPI_INT64_T, 0, g.world, &r);
  const auto begin = std::chrono::steady_clock::now();
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) break;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (waited > g.timeout_seconds) {
      std::fprintf(stderr,
                   "\ncleave serve: TIMEOUT on rank 0: the broadcast of a step's head has not "
                   "completed after %.1f s (parallel.comm_timeout_s = %.1f): a rank is stuck or "
                   "gone; aborting the job\n",
                   waited, g.timeout_seconds);
      MPI_Abort(MPI_COMM_WORLD, 3);
      _exit(3);  // MPI_Abort does not return; if it ever did, do not hang
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (payload.empty()) return;
  g.steps->broadcast(const_cast<int64_t*>(payload.data()), int64_t(payload.size()), CommType::i64, 0)
      .wait();
}

// Each lane's logit rows (rows[l] x vocab floats), lane by lane, at ep rank 0 (`all`).
void gather_lanes(const float* mine, const std::vector<int64_t>& rows, int lane, const PeerGroups& g,
                  float* all) {
  std::vector<int64_t> counts;
  for (int64_t r : rows) counts.push_back(r * g.vocab);
  g.ep->gatherv(mine, counts[size_t(lane)], all, counts, CommType::f32, 0).wait();
}

}  // namespace

void MpiPeers::send(const std::vector<Batch>& lanes) {
  serve::send(kStep, pack(lanes), groups_);
}

const float* MpiPeers::gather(const float* own, const std::vector<Batch>& lanes) {
  if (lanes.size() == 1) return own;
  std::vector<int64_t> rows;
  for (const Batch& b : lanes) rows.push_back(int64_t(b.logit_rows.size()));
  int64_t all = 0;
  for (int64_t r : rows) all += r;
  logits_.resize(size_t(std::max<int64_t>(all, 1) * groups_.vocab));
  gather_lanes(own, rows, 0, groups_, logits_.data());
  return logits_.data();
}

void MpiPeers::stop() { serve::send(kStop, {}, groups_); }

void follow_steps(Transformer& model, int64_t kv_blocks, KvDtype kv_dtype, const PeerGroups& groups) {
  KvPool pool = model.new_pool(kv_blocks, kernels::kAttentionKeyBlock, kv_dtype);
  pool.touch_all();
  // Rank 0 keeps the books: here every block counts as in use, so any table it sends is valid.
  while (pool.free_blocks() > 0) pool.allocate();
  const int lane = groups.ep ? groups.ep->rank() : 0;
  Batch batch;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> payload, rows;
  for (;;) {
    int64_t head[2] = {0, 0};
    MPI_Request r;
    MPI_Ibcast(head, 2, MPI_INT64_T, 0, groups.world, &r);
    for (int done = 0;;) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (head[0] == kStop) return;
    payload.resize(size_t(head[1]));
    if (!payload.empty())  // as rank 0 sends it
      groups.steps->broadcast(payload.data(), int64_t(payload.size()), CommType::i64, 0).wait();
    const std::vector<std::span<const int64_t>> lanes = lanes_of(payload);
    CLEAVE_CHECK(lane < int(lanes.size()), "a server step of " << lanes.size()
                                               << " lanes for ep rank " << lane);
    unpack(lanes[size_t(lane)], batch, tables);
    const float* logits = model.forward_cached(batch, pool);
    if (!groups.gathers || lanes.size() == 1) continue;
    rows.clear();
    for (const auto& l : lanes) rows.push_back(l[2]);  // each packed batch's logit row count
    gather_lanes(logits, rows, lane, groups, nullptr);
  }
}

}  // namespace cleave::serve
