// Group: checks the arguments of each operation, picks the algorithm, builds its task and queues it
// on the engine (communicator.cpp). The decision table for CommAlgo::fastest is here.
#include <algorithm>
#include <cstring>

#include "cleave/base/check.h"
#include "cleave/comm/communicator.h"
#include "cleave/comm/tasks.h"

namespace cleave {

using namespace comm_detail;

namespace {

// CommAlgo::fastest: which implementation wins, per collective, size and group size, from
// `cleave bench-comm` on the development machine (2-core VM, OpenMPI 4.1.4 over shared memory; the
// numbers are in the header comment of comm_bench.cpp). bytes: the op's size as bench-comm counts
// it (all_reduce: the buffer; all_gather: the gathered output; reduce_scatter: the input).
CommAlgo fastest(Op op, int64_t bytes, CommType t, int size) {
  constexpr int64_t KiB = 1024, MiB = 1024 * KiB;
  if (t == CommType::i64) return CommAlgo::mpi;  // bits only: MPI's copies
  if (size == 1) return CommAlgo::ours;  // a local copy
  switch (op) {
    case Op::all_reduce:
      // 2 ranks: ours at every size, fp32 1.3-4x MPI's busbw (MPI_Iallreduce is slower than the
      // blocking call), bf16 2-6x (MPI's path reduces an fp32 copy). 3-4 ranks: the ring's 2(n-1)
      // steps lose on latency below 256 KiB.
      if (size == 2 || t == CommType::bf16 || bytes >= 256 * KiB) return CommAlgo::ours;
      return CommAlgo::mpi;
    case Op::reduce_scatter:
      // ours at every size and group size measured: 1.5x at 4 KiB, 4-5x from 256 KiB (MPI's
      // reduce_scatter runs at 0.5-1 GB/s busbw), 10x in bf16.
      return CommAlgo::ours;
    case Op::all_gather:
      // copies only: even below 16 MiB with 2 ranks; from 16 MiB MPI's is 5-25% faster (one large
      // message per peer instead of 1 MiB chunks); with 3-4 ranks MPI's won at every size.
      return size == 2 && bytes < 16 * MiB ? CommAlgo::ours : CommAlgo::mpi;
    default: return CommAlgo::mpi;
  }
}

bool overlaps(const void* a, size_t abytes, const void* b, size_t bbytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return abytes && bbytes && pa < pb + bbytes && pb < pa + abytes;
}

}  // namespace

int64_t reduction_scratch_bytes(bool reduce_scatter, int64_t count, CommType t, int size,
                                CommAlgo a) {
  const Op op = reduce_scatter ? Op::reduce_scatter : Op::all_reduce;
  const int64_t bytes = count * int64_t(type_size(t)) * (reduce_scatter ? size : 1);
  if (a == CommAlgo::fastest) a = fastest(op, bytes, t, size);
  return a == CommAlgo::ours ? comm_detail::ring_scratch_bytes(op, count, t, size) : 0;
}

Group::Group(MPI_Comm comm, std::string name) : name_(std::move(name)) {
  CLEAVE_CHECK(comm != MPI_COMM_NULL, "Group \"" << name_ << "\": the communicator is MPI_COMM_NULL");
  Communicator& c = Communicator::get();
  GroupInfo info;
  auto w = std::make_shared<WorkState>();
  w->op = Op::create;
  w->kind = Kind::fence;
  w->group = name_;
  w->task = create_group_task(comm, &info);
  c.submit(w).wait();
  comm_ = info.comm;
  ring_comm_ = info.ring_comm;
  rank_ = info.rank;
  size_ = info.size;
  slot_ = c.status().add_group(name_, info.members, rank_);
}

Group::~Group() {
  try {
    if (Communicator* c = Communicator::instance()) {
      auto w = std::make_shared<WorkState>();
      w->op = Op::destroy;
      w->kind = Kind::fence;  // after every operation issued before it completed
      w->group = name_;
      w->task = destroy_group_task(comm_, ring_comm_);
      c->submit(w).wait();
      c->status().remove_group(slot_);
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      if (ring_comm_ != MPI_COMM_NULL) MPI_Comm_free(&ring_comm_);
    }
  } catch (...) {  // a destructor must not throw; the engine already reported any failure
  }
}

namespace {

Work issue(Op op, const std::string& group, int slot, uint64_t seq, int64_t bytes, CommAlgo algo,
           int peer, std::unique_ptr<Task> task, bool local = false) {
  auto w = std::make_shared<WorkState>();
  w->local = local;
  w->op = op;
  w->kind = op_kind(op);
  w->group = group;
  w->slot = slot;
  w->seq = seq;
  w->bytes = bytes;
  w->algo = algo;
  w->peer = peer;
  w->task = std::move(task);
  return Communicator::get().submit(std::move(w));
}

}  // namespace

#define CLEAVE_COMM_ARGS(op_text)                                                          \
  CollArgs args;                                                                           \
  args.comm = comm_;                                                                       \
  args.ring_comm = ring_comm_;                                                             \
  args.rank = rank_;                                                                       \
  args.size = size_;                                                                       \
  args.type = t;                                                                           \
  args.count = count;                                                                      \
  CLEAVE_CHECK(count >= 0, op_text << " on group \"" << name_ << "\": count " << count << " < 0")

Work Group::all_reduce(void* buf, int64_t count, CommType t, CommAlgo a) {
  CLEAVE_COMM_ARGS("all_reduce");
  CLEAVE_CHECK(t != CommType::i64, "all_reduce on group \"" << name_ << "\": i64 moves bits only");
  CLEAVE_CHECK(buf || count == 0, "all_reduce on group \"" << name_ << "\": null buffer");
  args.recv = buf;
  const int64_t bytes = count * int64_t(type_size(t));
  if (a == CommAlgo::fastest) a = fastest(Op::all_reduce, bytes, t, size_);
  auto task = a == CommAlgo::ours ? ring_task(Op::all_reduce, args) : mpi_task(Op::all_reduce, args);
  return issue(Op::all_reduce, name_, slot_, ++sequence_, bytes, a, -1, std::move(task),
               size_ == 1 && a == CommAlgo::ours);
}

Work Group::all_gather(const void* send, void* recv, int64_t count, CommType t, CommAlgo a) {
  CLEAVE_COMM_ARGS("all_gather");
  const size_t ts = type_size(t), block = size_t(count) * ts;
  CLEAVE_CHECK((send && recv) || count == 0, "all_gather on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(send == static_cast<char*>(recv) + rank_ * block ||
                   !overlaps(send, block, recv, block * size_t(size_)),
               "all_gather on group \"" << name_ << "\": send overlaps recv but is not recv + rank * count");
  args.send = send;
  args.recv = recv;
  const int64_t bytes = int64_t(block) * size_;
  if (a == CommAlgo::fastest) a = fastest(Op::all_gather, bytes, t, size_);
  auto task = a == CommAlgo::ours ? ring_task(Op::all_gather, args) : mpi_task(Op::all_gather, args);
  return issue(Op::all_gather, name_, slot_, ++sequence_, bytes, a, -1, std::move(task),
               size_ == 1 && a == CommAlgo::ours);
}

Work Group::reduce_scatter(const void* send, void* recv, int64_t count, CommType t, CommAlgo a) {
  CLEAVE_COMM_ARGS("reduce_scatter");
  CLEAVE_CHECK(t != CommType::i64, "reduce_scatter on group \"" << name_ << "\": i64 moves bits only");
  const size_t ts = type_size(t), block = size_t(count) * ts;
  CLEAVE_CHECK((send && recv) || count == 0, "reduce_scatter on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(recv == static_cast<const char*>(send) + rank_ * block ||
                   !overlaps(send, block * size_t(size_), recv, block),
               "reduce_scatter on group \"" << name_
                                            << "\": recv overlaps send but is not send + rank * count");
  args.send = send;
  args.recv = recv;
  const int64_t bytes = int64_t(block) * size_;
  if (a == CommAlgo::fastest) a = fastest(Op::reduce_scatter, bytes, t, size_);
  auto task = a == CommAlgo::ours ? ring_task(Op::reduce_scatter, args)
                                  : mpi_task(Op::reduce_scatter, args);
  return issue(Op::reduce_scatter, name_, slot_, ++sequence_, bytes, a, -1, std::move(task),
               size_ == 1 && a == CommAlgo::ours);
}

Work Group::broadcast(void* buf, int64_t count, CommType t, int root) {
  CLEAVE_COMM_ARGS("broadcast");
  CLEAVE_CHECK(buf || count == 0, "broadcast on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(root >= 0 && root < size_,
               "broadcast on group \"" << name_ << "\": root " << root << " is not in [0, " << size_ << ")");
  args.recv = buf;
  args.peer = root;
  return issue(Op::broadcast, name_, slot_, ++sequence_, count * int64_t(type_size(t)),
               CommAlgo::mpi, root, mpi_task(Op::broadcast, args));
}

Work Group::all_to_all(const void* send, void* recv, int64_t count, CommType t) {
  CLEAVE_COMM_ARGS("all_to_all");
  const size_t bytes = size_t(count) * type_size(t) * size_t(size_);
  CLEAVE_CHECK((send && recv) || count == 0, "all_to_all on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(send == recv || !overlaps(send, bytes, recv, bytes),
               "all_to_all on group \"" << name_ << "\": send and recv overlap (only send == recv may)");
  args.send = send;
  args.recv = recv;
  return issue(Op::all_to_all, name_, slot_, ++sequence_, int64_t(bytes), CommAlgo::mpi, -1,
               mpi_task(Op::all_to_all, args));
}

Work Group::all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                        const std::vector<int64_t>& recv_counts, CommType t) {
  const int64_t count = 0;
  CLEAVE_COMM_ARGS("all_to_allv");
  CLEAVE_CHECK(int(send_counts.size()) == size_ && int(recv_counts.size()) == size_,
               "all_to_allv on group \"" << name_ << "\": " << send_counts.size() << " send counts and "
                                         << recv_counts.size() << " recv counts for " << size_ << " ranks");
  int64_t sent = 0, received = 0;
  for (int i = 0; i < size_; ++i) {
    CLEAVE_CHECK(send_counts[size_t(i)] >= 0 && recv_counts[size_t(i)] >= 0,
                 "all_to_allv on group \"" << name_ << "\": negative count for rank " << i);
    sent += send_counts[size_t(i)];
    received += recv_counts[size_t(i)];
  }
  const size_t ts = type_size(t);
  CLEAVE_CHECK((send || sent == 0) && (recv || received == 0),
               "all_to_allv on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(!overlaps(send, size_t(sent) * ts, recv, size_t(received) * ts),
               "all_to_allv on group \"" << name_ << "\": send and recv overlap");
  args.send = send;
  args.recv = recv;
  args.send_counts = send_counts;
  args.recv_counts = recv_counts;
  return issue(Op::all_to_allv, name_, slot_, ++sequence_, sent * int64_t(ts), CommAlgo::mpi, -1,
               mpi_task(Op::all_to_allv, args));
}

Work Group::gatherv(const void* send, int64_t count, void* recv, const std::vector<int64_t>& counts,
                    CommType t, int root) {
  CLEAVE_COMM_ARGS("gatherv");
  CLEAVE_CHECK(root >= 0 && root < size_,
               "gatherv on group \"" << name_ << "\": root " << root << " is not in [0, " << size_ << ")");
  CLEAVE_CHECK(int(counts.size()) == size_, "gatherv on group \"" << name_ << "\": " << counts.size()
                                                                    << " counts for " << size_ << " ranks");
  CLEAVE_CHECK(counts[size_t(rank_)] == count,
               "gatherv on group \"" << name_ << "\": rank " << rank_ << " sends " << count
                                     << " elements where the counts say " << counts[size_t(rank_)]);
  int64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    CLEAVE_CHECK(counts[size_t(i)] >= 0, "gatherv on group \"" << name_ << "\": negative count for rank " << i);
    total += counts[size_t(i)];
  }
  const size_t ts = type_size(t);
  CLEAVE_CHECK(send || count == 0, "gatherv on group \"" << name_ << "\": null buffer");
  CLEAVE_CHECK(rank_ != root || recv || total == 0, "gatherv on group \"" << name_ << "\": null buffer at the root");
  CLEAVE_CHECK(rank_ != root || !overlaps(send, size_t(count) * ts, recv, size_t(total) * ts),
               "gatherv on group \"" << name_ << "\": send and recv overlap");
  args.send = send;
  args.recv = recv;
  args.peer = root;
  args.recv_counts = counts;
  return issue(Op::gatherv, name_, slot_, ++sequence_, count * int64_t(ts), CommAlgo::mpi, root,
               mpi_task(Op::gatherv, args));
}

namespace {

// The point-to-point arguments a send or a receive must satisfy.
void check_p2p(const char* op, const std::string& group, const void* buf, int64_t count, int peer,
               int tag, int size) {
  CLEAVE_CHECK(buf || count == 0, op << " on group \"" << group << "\": null buffer");
  CLEAVE_CHECK(peer >= 0 && peer < size, op << " on group \"" << group << "\": peer " << peer
                                            << " is not in [0, " << size << ")");
  CLEAVE_CHECK(tag >= 0 && tag <= 32767, op << " on group \"" << group << "\": tag " << tag
                                            << " is not in [0, 32767]");
}

}  // namespace

Work Group::send(const void* buf, int64_t count, CommType t, int peer, int tag) {
  CLEAVE_COMM_ARGS("send");
  check_p2p("send", name_, buf, count, peer, tag, size_);
  args.send = buf;
  args.peer = peer;
  args.tag = tag;
  return issue(Op::send, name_, slot_, ++p2p_sequence_, count * int64_t(type_size(t)),
               CommAlgo::mpi, peer, mpi_task(Op::send, args));
}

Work Group::recv(void* buf, int64_t count, CommType t, int peer, int tag) {
  CLEAVE_COMM_ARGS("recv");
  check_p2p("recv", name_, buf, count, peer, tag, size_);
  args.recv = buf;
  args.peer = peer;
  args.tag = tag;
  return issue(Op::recv, name_, slot_, ++p2p_sequence_, count * int64_t(type_size(t)),
               CommAlgo::mpi, peer, mpi_task(Op::recv, args));
}

Work Group::barrier() {
  const int64_t count = 0;
  const CommType t = CommType::f32;
  CLEAVE_COMM_ARGS("barrier");
  return issue(Op::barrier, name_, slot_, ++sequence_, 0, CommAlgo::mpi, -1,
               mpi_task(Op::barrier, args));
}

#undef CLEAVE_COMM_ARGS

double sum_of_doubles(Group& group, double local, double* waited) {
  float parts[2] = {float(local), 0.0f};
  parts[1] = float(local - double(parts[0]));
  const double seconds = group.all_reduce(parts, 2, CommType::f32, CommAlgo::ours).wait();
  if (waited) *waited += seconds;
  return double(parts[0]) + double(parts[1]);
}

std::vector<float> max_over(Group& group, const std::vector<float>& local, double* waited) {
  const size_t n = local.size();
  if (n == 0) return {};
  std::vector<float> every(n * size_t(group.size()));
  const double seconds =
      group.all_gather(local.data(), every.data(), int64_t(n), CommType::f32).wait();
  if (waited) *waited += seconds;
  std::vector<float> largest(every.begin(), every.begin() + std::ptrdiff_t(n));
  for (int r = 1; r < group.size(); ++r)
    for (size_t i = 0; i < n; ++i) largest[i] = std::max(largest[i], every[size_t(r) * n + i]);
  return largest;
}

std::string broadcast_string(Group& group, std::string s, int root) {
  float length = float(s.size());
  group.broadcast(&length, 1, CommType::f32, root).wait();
  const size_t n = size_t(length);
  std::vector<float> words((n + 3) / 4);
  std::memcpy(words.data(), s.data(), std::min(n, s.size()));
  group.broadcast(words.data(), int64_t(words.size()), CommType::f32, root).wait();
  s.assign(reinterpret_cast<const char*>(words.data()), n);
  return s;
}

std::vector<std::string> gather_strings(const std::string& mine, int rank, int world) {
  int length = int(mine.size());
  std::vector<int> lengths(static_cast<size_t>(world)), displs(static_cast<size_t>(world));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int at = 0;
    for (int r = 0; r < world; ++r) displs[size_t(r)] = at, at += lengths[size_t(r)];
    all.resize(size_t(at));
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR,
              0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < world; ++r)
      out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lengths[size_t(r)])));
  return out;
}

}  // namespace cleave
