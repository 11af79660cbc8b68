// Communication over MPI (docs/architecture.md, Communication). A Group wraps one communicator of
// the mesh. Every operation is asynchronous: it returns a Work to wait on, so communication
// overlaps compute. Operations are executed in the order they were issued on each rank; all ranks
// of a group must issue the group's collectives in the same order (the flight recorder checks and
// reports this). Reductions are sums with a fixed order (deterministic: the same layout gives
// bitwise the same result every run). bf16 data is reduced in fp32 and rounded once.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cleave {

// The elements an operation moves. i64 moves bits only (broadcasts, gathers, send and recv): no
// reduction takes it.
enum class CommType { f32, bf16, i64 };

// Which implementation runs a collective: cleave's own (chunked ring / pairwise over point-to-point
// with persistent buffers) or MPI's. `fastest` picks per collective and size from measurements
// (`cleave bench-comm`); both are kept so each can be checked against the other.
enum class CommAlgo { fastest, ours, mpi };

// The bytes each of `ranks` ranks sends in a ring all-reduce of `bytes` (a reduce-scatter, then an
// all-gather): how the tp and pp byte counts (metrics.jsonl) count an all-reduce.
inline int64_t ring_all_reduce_bytes(int64_t bytes, int ranks) {
  return 2 * bytes * (ranks - 1) / ranks;
}
// The bytes each of `ranks` ranks sends in a ring all-gather or reduce-scatter whose share per
// rank is `share` bytes (its own share, or each of the others', passed on).
inline int64_t ring_gather_bytes(int64_t share, int ranks) { return share * (ranks - 1); }

// The bytes of the engine's persistent scratch (one per process, grown to its largest use) that an
// all_reduce of a buffer of `count` elements, or with reduce_scatter a reduce_scatter of `count`
// elements per rank, over `size` ranks writes on the implementation `a` resolves to: cleave's ring
// stages the partial sums it receives, up to a window of 1 MiB chunks (comm/ring.cpp); MPI's
// collectives keep their buffers inside MPI. For the planner's communication buffers.
int64_t reduction_scratch_bytes(bool reduce_scatter, int64_t count, CommType t, int size,
                                CommAlgo a = CommAlgo::fastest);

struct WorkState;

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> s) : state_(std::move(s)) {}
  // Blocks until the operation completes; returns the seconds spent blocked here (exposed
  // communication). Throws cleave::Error if the operation failed. An operation that exceeds
  // CommOptions::timeout_seconds does not return: the rank reports and aborts the job.
  // A Work may be waited on from any thread, any number of times.
  double wait();
  bool done() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<WorkState> state_;
};

struct CommOptions {
  double timeout_seconds = 300;   // a collective taking longer aborts the job with a report
  int flight_recorder_size = 64;  // last N operations kept per rank
  std::string status_dir;         // where ranks publish progress for the timeout report: the
                                  // job's folder cleave-<pid of rank 0>-<time> is made in it;
                                  // "" = /tmp (per host). A report sees the ranks whose folder
                                  // it can read: share it between hosts to see them all.
};

class Communicator;  // the process-wide engine: progress thread, flight recorder, status

class Group {
 public:
  // Collective over `comm` (which the Group duplicates): all ranks of comm must call it.
  Group(MPI_Comm comm, std::string name);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  MPI_Comm comm() const { return comm_; }

  // Sum in place over all ranks.
  Work all_reduce(void* buf, int64_t count, CommType t, CommAlgo a = CommAlgo::fastest);
  // recv[r * count + i] = send of rank r [i]. send may alias recv + rank * count (in place).
  Work all_gather(const void* send, void* recv, int64_t count, CommType t,
                  CommAlgo a = CommAlgo::fastest);
  // recv[i] = sum over ranks r of send_r[rank * count + i]; send holds size * count elements.
  Work reduce_scatter(const void* send, void* recv, int64_t count, CommType t,
                      CommAlgo a = CommAlgo::fastest);
  Work broadcast(void* buf, int64_t count, CommType t, int root);
  // Block r of send goes to rank r; block r of recv comes from rank r; count elements per block.
  Work all_to_all(const void* send, void* recv, int64_t count, CommType t);
  // Variable blocks: counts in elements, displacements implied by prefix sums.
  Work all_to_allv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                   const std::vector<int64_t>& recv_counts, CommType t);
  // At root, rank r's `count` elements (counts[r] of them, every rank passing the same counts) one
  // block after another in rank order into recv; recv is read only at root.
  Work gatherv(const void* send, int64_t count, void* recv, const std::vector<int64_t>& counts,
               CommType t, int root);
  Work send(const void* buf, int64_t count, CommType t, int peer, int tag);
  Work recv(void* buf, int64_t count, CommType t, int peer, int tag);
  Work barrier();

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm ring_comm_ = MPI_COMM_NULL;  // a second duplicate: our algorithms' point-to-point traffic
  std::string name_;
  int rank_ = 0, size_ = 1;
  int slot_ = -1;              // this group's entry in the published status (status.h)
  uint64_t sequence_ = 0;      // collectives issued on this group (the same on every member)
  uint64_t p2p_sequence_ = 0;  // send/recv issued on this group (differs between members)
};

// The sum of one double per member, carried as two floats (a float and the float of what it left
// out: about 1e-14 relative) in the group's fixed reduction order, so every member gets the same
// bits. Adds the seconds it waited to *waited when given.
double sum_of_doubles(Group& group, double local, double* waited = nullptr);

// The element-wise largest of every member's `local` (all the same length), by an all-gather
// (an exact operation: every member gets the same bits). Adds the seconds it waited to *waited
// when given.
std::vector<float> max_over(Group& group, const std::vector<float>& local, double* waited = nullptr);

// The root's string on every member, through a broadcast of its bytes (a broadcast moves bits).
std::string broadcast_string(Group& group, std::string s, int root = 0);

// Every rank's string at rank 0 of the world (the others get nothing): what each checkpoint
// writer lists in meta.json, each rank's traced spans. Collective over MPI_COMM_WORLD.
std::vector<std::string> gather_strings(const std::string& mine, int rank, int world);

// Process-wide setup, after MPI_Init_thread (MPI_THREAD_MULTIPLE, or at least SERIALIZED if the
// application makes no MPI calls of its own meanwhile): options, the progress thread, the status
// file, the SIGTERM report. Collective over MPI_COMM_WORLD. Idempotent; the options of the first
// call win. shutdown_comm() completes what is queued and joins the thread, before MPI_Finalize; it
// does nothing if init_comm was not called.
void init_comm(const CommOptions& options);
void shutdown_comm();

// A traced step's communication: between begin_comm_capture() and end_comm_capture(), every
// operation this rank completes is recorded (its kind, group, bytes, and when the progress thread
// started and finished it, steady-clock seconds: the step executor's clock).
struct CommRecord {
  std::string op, group;
  int64_t bytes = 0;
  int peer = -1;  // send/recv: the other rank in the group
  double started = 0, ended = 0;
};
void begin_comm_capture();
std::vector<CommRecord> end_comm_capture();

// From now on the first SIGTERM this process receives is a request, which sigterm_received() then
// reports, instead of the end of the rank with the report above (init_comm installs the handler):
// train.checkpoint_on_signal saves and exits, cleave serve drains. The caller answers it at a
// point of its choosing; `answer` (a string literal) is what the rank prints that it will do. A
// second SIGTERM ends the rank as it would without the request.
void sigterm_is_a_request(const char* answer);
bool sigterm_received();

// The flight recorder of this rank as text (sequence, op, group, bytes, start, end of the last N
// operations), for reports and tests.
std::string flight_recorder_report();

}  // namespace cleave
