#include "cleave/serve/step_peers.h"

#include <chrono>
#include <thread>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/kernels/attention.h"

namespace cleave::serve {

namespace {

enum : int64_t { kStop = 0, kStep = 1 };

// A batch as int64s: T, sequences, logit rows, then tokens, positions, cache_rows, cache_past,
// each table's length, the tables, logit_rows.
std::vector<int64_t> pack(const Batch& b) {
  const size_t S = b.cache_past.size();
  std::vector<int64_t> v{b.T, int64_t(S), int64_t(b.logit_rows.size())};
  v.insert(v.end(), b.tokens.begin(), b.tokens.end());
  v.insert(v.end(), b.positions.begin(), b.positions.end());
  v.insert(v.end(), b.cache_rows.begin(), b.cache_rows.end());
  v.insert(v.end(), b.cache_past.begin(), b.cache_past.end());
  for (const auto& t : b.cache_blocks) v.push_back(int64_t(t.size()));
  for (const auto& t : b.cache_blocks) v.insert(v.end(), t.begin(), t.end());
  v.insert(v.end(), b.logit_rows.begin(), b.logit_rows.end());
  return v;
}

void unpack(const std::vector<int64_t>& v, Batch& b, std::vector<std::vector<int32_t>>& tables) {
  size_t at = 0;
  auto take = [&](size_t n) {
    CLEAVE_CHECK(at + n <= v.size(), "a server step of " << v.size() << " values cut short");
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

// The head goes by MPI_Ibcast on every rank (a nonblocking collective matches only its kind),
// so that the others can wait for it asleep; the payload follows at once, by MPI_Bcast.
void send(int64_t kind, const std::vector<int64_t>& payload, MPI_Comm comm) {
  int64_t head[2] = {kind, int64_t(payload.size())};
  MPI_Request r;
  MPI_Ibcast(head, 2, MPI_INT64_T, 0, comm, &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  if (!payload.empty())
    MPI_Bcast(const_cast<int64_t*>(payload.data()), int(payload.size()), MPI_INT64_T, 0, comm);
}

}  // namespace

void send_step(const Batch& batch, MPI_Comm comm) { send(kStep, pack(batch), comm); }
void send_stop(MPI_Comm comm) { send(kStop, {}, comm); }

void follow_steps(Transformer& model, int64_t kv_blocks, MPI_Comm comm) {
  KvPool pool = model.new_pool(kv_blocks, kernels::kAttentionKeyBlock);
  // Rank 0 keeps the books: here every block counts as in use, so any table it sends is valid.
  while (pool.free_blocks() > 0) pool.allocate();
  Batch batch;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> payload;
  for (;;) {
    int64_t head[2] = {0, 0};
    MPI_Request r;
    MPI_Ibcast(head, 2, MPI_INT64_T, 0, comm, &r);
    for (int done = 0;;) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (head[0] == kStop) return;
    payload.resize(size_t(head[1]));
    MPI_Bcast(payload.data(), int(payload.size()), MPI_INT64_T, 0, comm);
    unpack(payload, batch, tables);
    model.forward_cached(batch, pool);
  }
}

}  // namespace cleave::serve
