// cleave's own all_reduce, reduce_scatter and all_gather: a chunked, pipelined ring over
// point-to-point messages on the group's second communicator.
//
// The data is cut into one block per rank (all_reduce: block b holds elements [b*count/n,
// (b+1)*count/n); reduce_scatter and all_gather: block b is rank b's count elements). All three
// run steps of the same ring: at step k rank r sends block (r-1-k) mod n to rank r+1 and receives
// block (r-2-k) mod n from rank r-1. Steps 0..n-2 reduce (the received partial sum plus this
// rank's own data), after which rank r holds the full sum of block r; steps n-1..2n-3 pass the
// finished blocks around. reduce_scatter runs the first half, all_gather the second, all_reduce both.
//
// Each block is cut into chunks (kChunkElems) and each chunk moves through the steps on its own, so
// reducing one chunk overlaps receiving the next, and a chunk can be sent on as soon as it was
// reduced. At most kWindow receives and kWindow sends are outstanding; received partial sums land
// in a staging area of kWindow chunks. All buffers (staging, fp32 partial sums) are the engine's
// persistent scratch: nothing is allocated per call.
//
// Determinism: block b is summed in the fixed order b+1, b+2, ..., b (mod n), one fp32 addition per
// step, so the same group and count give bitwise the same result every run, on every rank.
// bf16: a rank's own data leaves as bf16 (step 0) and finished blocks travel as bf16, but partial
// sums are kept and sent in fp32 (steps 1..n-2; there are none with 2 ranks) and every element is
// rounded to bf16 exactly once, after its last addition.
#include <algorithm>
#include <atomic>

#include "cleave/base/check.h"
#include "cleave/comm/communicator.h"
#include "cleave/comm/tasks.h"

namespace cleave::comm_detail {

namespace {

// Chunks of 1 MiB of fp32, up to 8 in flight each way (8 MiB of staging). Fewer, larger
// messages let one wake-up of the progress thread move more data: on the 2-core development
// machine 256 KiB chunks with 4 in flight left a 16 MiB all_reduce stalled while the main thread
// computed (wait() then blocked for about the whole all_reduce), 1 MiB x 8 overlapped fully.
constexpr int64_t kChunkElems = 256 * 1024;
constexpr int64_t kWindow = 8;
std::atomic<int64_t> g_chunk_elems{kChunkElems}, g_window{kWindow};  // see set_ring_geometry

inline float load(float x) { return x; }
inline float load(uint16_t x) { return from_bf16(x); }
inline void put(float& d, float x) { d = x; }
inline void put(uint16_t& d, float x) { d = to_bf16(x); }

template <class A, class B, class D>
void add_into(const void* a, const void* b, void* d, int64_t n) {
  const A* __restrict pa = static_cast<const A*>(a);  // the staging area: aliases nothing
  const B* pb = static_cast<const B*>(b);
  D* pd = static_cast<D*>(d);  // may alias b (in place): element i is read before it is written
  for (int64_t i = 0; i < n; ++i) put(pd[i], load(pa[i]) + load(pb[i]));
}

// d = a + b with a, b, d each fp32 or bf16 (a: received, b: own data, d: partial or result).
void add(CommType ta, const void* a, CommType tb, const void* b, CommType td, void* d, int64_t n) {
  const bool fa = ta == CommType::f32, fb = tb == CommType::f32, fd = td == CommType::f32;
  if (fa && fb && fd) add_into<float, float, float>(a, b, d, n);
  else if (fa && fb) add_into<float, float, uint16_t>(a, b, d, n);
  else if (fa && fd) add_into<float, uint16_t, float>(a, b, d, n);
  else if (fa) add_into<float, uint16_t, uint16_t>(a, b, d, n);
  else if (fb && fd) add_into<uint16_t, float, float>(a, b, d, n);
  else if (fb) add_into<uint16_t, float, uint16_t>(a, b, d, n);
  else if (fd) add_into<uint16_t, uint16_t, float>(a, b, d, n);
  else add_into<uint16_t, uint16_t, uint16_t>(a, b, d, n);
}

class RingTask : public Task {
 public:
  RingTask(Op op, const CollArgs& a)
      : op_(op), a_(a), n_(a.size), r_(a.rank), chunk_(g_chunk_elems.load()), window_(g_window.load()) {
    const int64_t ts = int64_t(type_size(a.type));
    off_.resize(size_t(n_) + 1);
    for (int b = 0; b <= n_; ++b)
      off_[size_t(b)] = op == Op::all_reduce ? a.count * b / n_ : a.count * b;
    int64_t max_block = 0;
    for (int b = 0; b < n_; ++b) max_block = std::max(max_block, off_[size_t(b) + 1] - off_[size_t(b)]);
    K_ = (max_block + chunk_ - 1) / chunk_;
    switch (op) {
      case Op::all_reduce:
        in_ = static_cast<const char*>(a.recv);
        out_ = static_cast<char*>(a.recv);
        k0_ = 0;
        k1_ = 2 * (n_ - 1);
        break;
      case Op::reduce_scatter:
        in_ = static_cast<const char*>(a.send);
        out_ = static_cast<char*>(a.recv) - off_[size_t(r_)] * ts;  // block r lands in recv
        k0_ = 0;
        k1_ = n_ - 1;
        break;
      case Op::all_gather:
        in_ = static_cast<const char*>(a.recv);
        out_ = static_cast<char*>(a.recv);
        k0_ = n_ - 1;
        k1_ = 2 * (n_ - 1);
        break;
      default: CLEAVE_FAIL("ring: unsupported op " << op_name(op));
    }
    total_ = (k1_ - k0_) * K_;
    // Partial sums live in the buffer itself for an fp32 all_reduce, else in two fp32 blocks
    // used by alternate steps.
    partials_in_place_ = op == Op::all_reduce && a.type == CommType::f32;
    max_block_ = max_block;
  }

  void start() override {
    Communicator& c = Communicator::get();
    const size_t ts = type_size(a_.type);
    if (op_ == Op::all_gather) {  // own block into place
      char* mine = out_ + off_[size_t(r_)] * int64_t(ts);
      // copy_n, not memcpy: with count 0 either buffer may be null (Group's contract).
      if (mine != a_.send)
        std::copy_n(static_cast<const char*>(a_.send), a_.count * int64_t(ts), mine);
    }
    if (op_ == Op::reduce_scatter && n_ == 1 && a_.recv != a_.send)
      std::copy_n(static_cast<const char*>(a_.send), a_.count * int64_t(ts),
                  static_cast<char*>(a_.recv));
    if (total_ == 0) return;
    staging_ = static_cast<char*>(c.scratch(0, size_t(window_ * chunk_) * 4));
    if (!partials_in_place_ && n_ > 2)
      acc_ = static_cast<float*>(c.scratch(1, size_t(2 * max_block_) * 4));
    std::fill(std::begin(send_req_), std::end(send_req_), MPI_REQUEST_NULL);
    std::fill(std::begin(recv_req_), std::end(recv_req_), MPI_REQUEST_NULL);
  }

  bool progress(bool& did_work) override {
    bool changed = true;
    while (changed) {
      changed = false;
      while (send_done_ < send_posted_ && test(send_req_[send_done_ % window_])) {
        ++send_done_;
        changed = true;
      }
      while (recv_done_ < recv_posted_) {
        const int64_t j = recv_done_;
        const int64_t k = k0_ + j / K_;
        // The reduction may overwrite the fp32 partial that send (k-1, c) reads: wait for it.
        if (k <= n_ - 2 && j >= K_ && j - K_ >= send_done_) break;
        if (!test(recv_req_[j % window_])) break;
        if (k <= n_ - 2) reduce(k, j % K_, staging_ + (j % window_) * chunk_ * 4);
        ++recv_done_;
        changed = true;
      }
      while (send_posted_ < total_ && send_posted_ - send_done_ < window_) {
        const int64_t j = send_posted_;
        if (j >= K_ && j - K_ >= recv_done_) break;  // the chunk is not ready yet
        post_send(j);
        ++send_posted_;
        changed = true;
      }
      while (recv_posted_ < total_ && recv_posted_ - recv_done_ < window_) {
        const int64_t j = recv_posted_;
        const int64_t k = k0_ + j / K_;
        // A finished block overwrites this rank's data for that block in an all_reduce: only
        // once the send of that data (step k+1-n) completed.
        if (op_ == Op::all_reduce && k >= n_ - 1 && j - (n_ - 1) * K_ >= send_done_) break;
        post_recv(j);
        ++recv_posted_;
        changed = true;
      }
      did_work |= changed;
    }
    return recv_done_ == total_ && send_done_ == total_;
  }

 private:
  int block_send(int64_t k) const { return int(((r_ - 1 - k) % n_ + n_) % n_); }
  int block_recv(int64_t k) const { return int(((r_ - 2 - k) % n_ + n_) % n_); }
  // Elements [lo, hi) of chunk c of block b.
  void chunk(int b, int64_t c, int64_t& lo, int64_t& hi) const {
    lo = off_[size_t(b)] + c * chunk_;
    hi = std::min(off_[size_t(b) + 1], lo + chunk_);
    lo = std::min(lo, hi);
  }
  // What travels at step k: own data and finished blocks in the user's type; partial sums fp32.
  CommType wire(int64_t k) const {
    return k == 0 || k >= n_ - 1 ? a_.type : CommType::f32;
  }
  // Where the partial sum of block b after step k lives (element lo of the block).
  float* partial(int64_t k, int b, int64_t lo) const {
    if (partials_in_place_) return reinterpret_cast<float*>(out_) + lo;
    return acc_ + (k % 2) * max_block_ + (lo - off_[size_t(b)]);
  }

  void post_send(int64_t j) {
    const int64_t k = k0_ + j / K_, c = j % K_;
    const int b = block_send(k);
    int64_t lo, hi;
    chunk(b, c, lo, hi);
    MPI_Request& req = send_req_[j % window_];
    if (hi == lo) {
      req = MPI_REQUEST_NULL;  // the receiver skips this empty chunk too
      return;
    }
    const CommType w = wire(k);
    const int64_t ts = int64_t(type_size(a_.type));
    const void* src;
    if (k == 0) src = in_ + lo * ts;              // own data
    else if (k >= n_ - 1) src = out_ + lo * ts;   // a finished block
    else src = partial(k - 1, b, lo);             // the partial sum of the previous step
    check_mpi(MPI_Isend(src, int((hi - lo) * int64_t(type_size(w))), MPI_BYTE, (r_ + 1) % n_, 0,
                        a_.ring_comm, &req),
              "MPI_Isend (ring)");
  }

  void post_recv(int64_t j) {
    const int64_t k = k0_ + j / K_, c = j % K_;
    const int b = block_recv(k);
    int64_t lo, hi;
    chunk(b, c, lo, hi);
    MPI_Request& req = recv_req_[j % window_];
    if (hi == lo) {
      req = MPI_REQUEST_NULL;
      return;
    }
    const CommType w = wire(k);
    void* dst = k <= n_ - 2 ? static_cast<void*>(staging_ + (j % window_) * chunk_ * 4)
                            : static_cast<void*>(out_ + lo * int64_t(type_size(a_.type)));
    check_mpi(MPI_Irecv(dst, int((hi - lo) * int64_t(type_size(w))), MPI_BYTE, (r_ - 1 + n_) % n_,
                        0, a_.ring_comm, &req),
              "MPI_Irecv (ring)");
  }

  // Step k received chunk c of block b (a partial sum from rank r-1) into `got`: add our data.
  void reduce(int64_t k, int64_t c, const char* got) {
    const int b = block_recv(k);
    int64_t lo, hi;
    chunk(b, c, lo, hi);
    if (hi == lo) return;
    const int64_t ts = int64_t(type_size(a_.type));
    const void* own = in_ + lo * ts;
    if (k == n_ - 2) add(wire(k), got, a_.type, own, a_.type, out_ + lo * ts, hi - lo);  // final
    else add(wire(k), got, a_.type, own, CommType::f32, partial(k, b, lo), hi - lo);
  }

  bool test(MPI_Request& req) {
    if (req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test (ring)");
    return flag != 0;
  }

  Op op_;
  CollArgs a_;
  int n_, r_;
  int64_t chunk_, window_;  // elements per message, messages in flight each way (<= kWindow)
  std::vector<int64_t> off_;
  int64_t K_ = 0;          // chunks per block
  int64_t k0_ = 0, k1_ = 0;  // steps [k0, k1)
  int64_t total_ = 0;      // (k1 - k0) * K messages each way; message j: step k0 + j / K, chunk j % K
  int64_t max_block_ = 0;
  bool partials_in_place_ = false;
  const char* in_ = nullptr;  // own data (type), indexed by element
  char* out_ = nullptr;       // results (type), indexed by element
  char* staging_ = nullptr;   // window_ chunks of received partial sums
  float* acc_ = nullptr;      // two blocks of fp32 partial sums
  MPI_Request send_req_[kWindow], recv_req_[kWindow];
  int64_t send_posted_ = 0, send_done_ = 0, recv_posted_ = 0, recv_done_ = 0;
};

}  // namespace

void set_ring_geometry(int64_t chunk_elems, int64_t window) {
  CLEAVE_CHECK(chunk_elems > 0 && window >= 1 && window <= kWindow,
               "ring geometry: chunk " << chunk_elems << ", window " << window);
  g_chunk_elems.store(chunk_elems);
  g_window.store(window);
}

void reset_ring_geometry() {
  g_chunk_elems.store(kChunkElems);
  g_window.store(kWindow);
}

std::unique_ptr<Task> ring_task(Op op, const CollArgs& a) {
  return std::make_unique<RingTask>(op, a);
}

int64_t ring_scratch_bytes(Op op, int64_t count, CommType t, int size) {
  if (size < 2 || count <= 0 || (op != Op::all_reduce && op != Op::reduce_scatter)) return 0;
  const int64_t chunk = g_chunk_elems.load(), window = g_window.load();
  const int64_t block = op == Op::all_reduce ? (count + size - 1) / size : count;
  const int64_t received = int64_t(size - 1) * ((block + chunk - 1) / chunk);  // reduce steps
  int64_t bytes = std::min(window, received) * chunk * 4;
  if (!(op == Op::all_reduce && t == CommType::f32) && size > 2) bytes += 2 * block * 4;
  return bytes;
}

}  // namespace cleave::comm_detail
