// The communication engine: queue, progress thread, watchdog, SIGTERM report, init/shutdown, Work.
//
// Progress. One thread per process runs every operation: it starts them in issue order (see Kind
// in internal.h) and polls them (MPI_Test and friends, never a blocking MPI call). While nothing
// completes it backs off: a few immediate polls, then short sleeps growing to 50 us (see backoff()),
// so on a machine with as many compute threads as cores it costs little CPU while a peer is late;
// it sleeps on a condition variable when idle. It is the only thread that calls MPI between
// init_comm and shutdown_comm, which is why MPI_THREAD_SERIALIZED is enough (an application that
// makes its own MPI calls meanwhile needs MPI_THREAD_MULTIPLE).
//
// Timeouts. A watchdog thread checks the running operations every 100 ms; one running longer than
// timeout_seconds makes this rank print the status of every rank (status.h) and its flight
// recorder to stderr, then MPI_Abort. The watchdog is separate from the progress thread so that
// the report comes even if an MPI call hangs.
//
// SIGTERM. mpirun stops the other ranks with it when one dies or calls MPI_Abort: each then reports
// where every rank stood, unless a rank marked itself failed (an error of its own, which it
// reported: no communication fault to explain). A scheduler sends it too, before it preempts a
// job: with sigterm_is_a_request() (train.checkpoint_on_signal, cleave serve) the first SIGTERM
// only raises a flag, which the trainer answers with a checkpoint and a clean exit at the next
// step's end, and the server by draining; a second one (the scheduler's or mpirun's patience
// running out) ends the rank as before.
#include "cleave/comm/communicator.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cleave/base/check.h"

namespace cleave {

using namespace comm_detail;

namespace {

std::atomic<Communicator*> g_instance{nullptr};
std::mutex g_init_m;
struct sigaction g_old_sigterm;
bool g_sigterm_installed = false;
// Lock-free atomics: the handler reads and counts them (async-signal-safe).
std::atomic<bool> g_sigterm_saves{false};
std::atomic<const char*> g_sigterm_answer{""};  // what the rank does about the request
std::atomic<int> g_sigterms{0};  // received while g_sigterm_saves

extern "C" void on_sigterm(int signo) {
  Communicator* c = g_instance.load();
  // mpirun stopping the job for a rank's error (which marked it, or removed the folder) is no
  // request: nothing would answer it.
  auto for_error = [c] {
    return c && (c->status().failed_rank() >= 0 || !c->status().own_file_present());
  };
  if (g_sigterm_saves.load() && !for_error() && g_sigterms.fetch_add(1) == 0) {
    // The request: the training thread sees sigterm_received() at its next step's end.
    int fd = 2;
    SafeText out(SafeText::fd_sink, &fd);
    out.str("cleave: rank ").num(c ? c->world_rank() : 0)
        .str(" received SIGTERM: ").str(g_sigterm_answer.load())
        .str(" (a second SIGTERM ends it at once)\n");
    return;
  }
  if (c) c->write_signal_report(signo);
  // Then do what would have happened without us: the previous handler, or die of the signal.
  if (g_old_sigterm.sa_handler != SIG_DFL && g_old_sigterm.sa_handler != SIG_IGN &&
      !(g_old_sigterm.sa_flags & SA_SIGINFO)) {
    g_old_sigterm.sa_handler(signo);
    return;
  }
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(signo, &dfl, nullptr);
  raise(signo);  // delivered when this handler returns
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// No progress in `idle` consecutive polls: wait a little before polling again. A few immediate
// polls (each MPI_Test costs well under a microsecond), then sleeps of 4, 8, 16, 32, 50 us, while
// the rank computes: sched_yield, next to a CPU-bound compute thread on the same core, hands over
// the rest of a scheduler time slice (milliseconds), while a thread waking from a short sleep gets
// the core back promptly. While a thread of the rank is blocked in Work::wait the rank computes
// nothing, and the progress thread yields instead of sleeping, as MPI's own blocking calls do
// (mpi_yield_when_idle): it keeps its core and sees the peer's message at once. Sleeping there
// made a meeting at a small collective between short computations (tensor parallelism's) cost
// two to four times what MPI's own wait costs (docs/performance.md, Meetings).
void backoff(int idle, bool rank_waits) {
  if (idle < 32) return;
  if (rank_waits) {
    sched_yield();
    return;
  }
  const int us = std::min(50, 4 << std::min(idle - 32, 4));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

}  // namespace

void comm_detail::check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  CLEAVE_FAIL(what << " failed: " << std::string(text, size_t(n)));
}

Communicator::Communicator(const CommOptions& options, const std::string& status_dir,
                           int world_rank, int world_size, std::vector<std::string> hosts)
    : options_(options),
      world_rank_(world_rank),
      world_size_(world_size),
      t0_(wall_seconds()),
      status_(status_dir, world_rank, world_size, std::move(hosts)),
      recorder_(options.flight_recorder_size, world_rank, t0_) {
  progress_thread_ = std::thread([this] { progress_loop(); });
  watchdog_thread_ = std::thread([this] { watchdog_loop(); });
}

Communicator::~Communicator() { stop(); }

void Communicator::stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(queue_m_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  progress_thread_.join();  // after the queue is drained (the watchdog still guards that)
  {
    std::lock_guard<std::mutex> lock(watchdog_m_);
    watchdog_stop_ = true;
  }
  watchdog_cv_.notify_all();
  watchdog_thread_.join();
}

Communicator* Communicator::instance() { return g_instance.load(); }

Communicator& Communicator::get() {
  Communicator* c = g_instance.load();
  CLEAVE_CHECK(c != nullptr, "communication is not initialised: call init_comm() after "
                             "MPI_Init_thread and before creating a Group");
  return *c;
}

Work Communicator::submit(std::shared_ptr<WorkState> w) {
  w->record = recorder_.add(*w, wall_seconds());
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(queue_m_);
    CLEAVE_CHECK(!stop_, "communication is shutting down: cannot issue " << op_name(w->op));
    // Nothing in flight: the rank's earlier operations have all completed, so running this one
    // now keeps the issue order. Another thread's operation issued meanwhile may run beside it:
    // a local one shares nothing with it.
    here = w->local && in_flight_.load() == 0;
    in_flight_.fetch_add(1);
    if (!here) queue_.push_back(w);
  }
  if (here) run_here(w);
  else queue_cv_.notify_one();
  return Work(std::move(w));
}

void Communicator::run_here(const std::shared_ptr<WorkState>& w) {
  if (!start(w)) return;
  bool done = false, did = false;
  std::string error;
  try {
    while (!done) done = w->task->progress(did);
  } catch (const std::exception& e) {
    error = e.what();
  }
  finish(*w, error);
}

void* Communicator::scratch(int index, size_t bytes) {
  CLEAVE_CHECK(index >= 0 && index < kScratchBuffers, "scratch buffer " << index);
  Buffer<char>& b = scratch_[index];
  if (size_t(b.size()) < bytes) {
    const size_t mib = size_t(1) << 20;
    b.resize(int64_t((bytes + mib - 1) / mib * mib));  // zeroed: pages are touched here, once
  }
  return b.data();
}

bool Communicator::start(const std::shared_ptr<WorkState>& w) {
  w->started = std::chrono::steady_clock::now();
  w->started_wall = wall_seconds();
  recorder_.started(w->record, w->started_wall);
  status_.started(*w);
  {
    std::lock_guard<std::mutex> lock(active_m_);
    active_.push_back(w);
  }
  try {
    w->task->start();
  } catch (const std::exception& e) {
    finish(*w, e.what());
    return false;
  }
  return true;
}

void Communicator::finish(WorkState& w, const std::string& error) {
  const double t = wall_seconds();
  recorder_.ended(w.record, t, !error.empty());
  {
    std::lock_guard<std::mutex> lock(capture_m_);
    if (capturing_) {
      auto seconds = [](std::chrono::steady_clock::time_point p) {
        return std::chrono::duration<double>(p.time_since_epoch()).count();
      };
      captured_.push_back({comm_detail::op_name(w.op), w.group, w.bytes, w.peer,
                           seconds(w.started), seconds(std::chrono::steady_clock::now())});
    }
  }
  status_.completed(w);
  {
    std::lock_guard<std::mutex> lock(active_m_);
    auto it = std::find_if(active_.begin(), active_.end(), [&](auto& p) { return p.get() == &w; });
    if (it != active_.end()) active_.erase(it);
  }
  w.task.reset();  // releases the task's requests and buffers before anyone waits on us again
  in_flight_.fetch_sub(1);  // first, so that the waiter's next local operation may run at once
  {
    std::lock_guard<std::mutex> lock(w.m);
    w.error = error;
    w.finished.store(true, std::memory_order_release);
  }
  w.cv.notify_all();
}

void Communicator::progress_loop() {
  prctl(PR_SET_TIMERSLACK, 5000UL);  // 5 us: make the short backoff sleeps short
  std::deque<std::shared_ptr<WorkState>> pending;  // issued, not started, in issue order
  std::vector<std::shared_ptr<WorkState>> running;
  int collectives = 0;  // running collectives (0 or 1)
  int idle = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_m_);
      if (pending.empty() && running.empty()) {
        queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;  // stop_ and nothing left to do
      }
      while (!queue_.empty()) {
        pending.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    bool did = false;
    bool held = false;  // an operation before this one waits
    for (auto it = pending.begin(); it != pending.end();) {
      const std::shared_ptr<WorkState>& w = *it;
      const bool can = w->kind == Kind::p2p ||
                       (w->kind == Kind::collective && collectives == 0 && !held) ||
                       (w->kind == Kind::fence && running.empty() && !held);
      if (!can) {
        if (w->kind == Kind::fence) break;
        held = true;
        ++it;
        continue;
      }
      if (start(w)) {
        collectives += w->kind != Kind::p2p;
        running.push_back(w);
      }
      it = pending.erase(it);
      did = true;
    }
    for (size_t i = 0; i < running.size();) {
      WorkState& w = *running[i];
      bool done = false;
      std::string error;
      try {
        done = w.task->progress(did);
      } catch (const std::exception& e) {
        done = true;
        error = e.what();
      }
      if (!done) {
        ++i;
        continue;
      }
      collectives -= w.kind != Kind::p2p;
      finish(w, error);
      running.erase(running.begin() + ptrdiff_t(i));
      did = true;
    }
    idle = did ? 0 : idle + 1;
    backoff(idle, waiting_.load(std::memory_order_relaxed) > 0);
  }
}

void Communicator::watchdog_loop() {
  std::unique_lock<std::mutex> lock(watchdog_m_);
  while (!watchdog_stop_) {
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    status_.heartbeat(wall_seconds());
    std::shared_ptr<WorkState> late;
    double elapsed = 0;
    {
      std::lock_guard<std::mutex> active_lock(active_m_);
      for (auto& w : active_) {
        const double s = std::chrono::duration<double>(now - w->started).count();
        if (s > options_.timeout_seconds && s > elapsed) {
          late = w;
          elapsed = s;
        }
      }
    }
    if (late) on_timeout(*late, elapsed);
  }
}

void Communicator::on_timeout(const WorkState& w, double elapsed) {
  reported_.store(true);
  status_.set_state(RankState::timed_out);
  int fd = 2;
  {
    SafeText out(SafeText::fd_sink, &fd);
    out.str("\ncleave comm: TIMEOUT on rank ").num(world_rank_).str(": ").str(op_name(w.op));
    out.str(w.kind == Kind::p2p ? " p2p#" : " #").unum(w.seq).str(" on group \"")
        .str(w.group.c_str()).str("\" (").bytes(w.bytes);
    if (w.kind == Kind::p2p) out.str(", peer ").num(w.peer);
    else out.str(", ").str(algo_name(w.algo));
    out.str(") has not completed after ").fixed(elapsed, 1).str(" s (timeout_seconds = ")
        .fixed(options_.timeout_seconds, 1).str(")\n");
    status_.write_report(out, w.kind == Kind::p2p ? -1 : w.slot, w.seq, w.op);
    recorder_.write(out);
    out.str("cleave comm: rank ").num(world_rank_).str(" aborts the job (MPI_Abort)\n");
  }
  status_.leave();
  // Ranks timing out at the same moment read the folder for their reports: give them a second.
  // Then the folder goes, whoever is left, since mpirun does not always let the ranks it stops
  // run their SIGTERM handler; those that do find their file gone and say nothing more.
  for (int i = 0; i < 50 && !status_.others_gone(); ++i) {
    const timespec pause{0, 20'000'000};
    nanosleep(&pause, nullptr);
  }
  status_.remove_folder();
  MPI_Abort(MPI_COMM_WORLD, 3);
  _exit(3);  // MPI_Abort does not return; if it ever did, do not hang
}

void Communicator::write_signal_report(int signo) {
  if (status_.state() == RankState::failed) return;  // said why; the mark stays for the others
  int fd = 2;
  if (reported_.exchange(true)) {  // this rank already reported a timeout (and left)
    SafeText out(SafeText::fd_sink, &fd);
    out.str("cleave comm: rank ").num(world_rank_).str(" terminated by signal ").num(signo)
        .chr('\n');
    status_.remove_folder();  // it was stopped in its grace second (on_timeout)
    return;
  }
  status_.set_state(RankState::terminated);
  // A rank that failed with an error has said why: it is marked failed, or it has already removed
  // the folder (its file last, so a missing file of that rank means this rank's is gone too).
  if (status_.failed_rank() < 0 && status_.own_file_present()) {
    SafeText out(SafeText::fd_sink, &fd);
    out.str("\ncleave comm: rank ").num(world_rank_).str(" terminated by signal ").num(signo);
    if (g_sigterms.load() > 1)
      out.str(" (a second SIGTERM: the first was a request, now cut short)\n");
    else
      out.str(" (the job is being stopped: another rank died, failed or timed out)\n");
    status_.write_report(out, -1, 0, Op::barrier);
    recorder_.write(out);
  }
  status_.leave();
}

void Communicator::mark_failed() {
  status_.set_state(RankState::failed);
  // The other ranks are about to be stopped by MPI_Abort, and mpirun does not always let them run
  // their SIGTERM handler (it may kill them outright): the folder goes now, whoever is left.
  status_.remove_folder();
}

// ---- public API ----

void init_comm(const CommOptions& options) {
  std::lock_guard<std::mutex> lock(g_init_m);
  if (g_instance.load()) return;
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  CLEAVE_CHECK(initialized && !finalized,
               "init_comm: MPI is not initialised: call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, "
               "...) first");
  MPI_Query_thread(&provided);
  CLEAVE_CHECK(provided >= MPI_THREAD_SERIALIZED,
               "init_comm: the communication thread needs MPI_THREAD_SERIALIZED or better, but "
               "MPI was initialised with "
                   << thread_level_name(provided)
                   << ": call MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)");
  CLEAVE_CHECK(options.timeout_seconds > 0,
               "CommOptions::timeout_seconds must be > 0, got " << options.timeout_seconds);
  CLEAVE_CHECK(options.flight_recorder_size > 0,
               "CommOptions::flight_recorder_size must be > 0, got " << options.flight_recorder_size);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // One status folder per job, inside status_dir: rank 0 names it, everyone else learns the name,
  // so jobs that share a status_dir keep their files apart. Each rank joins the name to its own
  // status_dir: normally the same path everywhere (a shared folder lets every rank's report see
  // every rank), but it need not be.
  char name[64] = {};
  if (rank == 0)
    std::snprintf(name, sizeof(name), "cleave-%ld-%ld", long(getpid()), long(time(nullptr)));
  MPI_Bcast(name, int(sizeof(name)), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string dir = options.status_dir.empty() ? std::string("/tmp") : options.status_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir != "/") dir += '/';
  dir += name;
  // Every rank's host, so that a report can say where a rank whose status file it cannot read runs.
  constexpr int kHost = 64;
  std::vector<char> all(size_t(size) * kHost, 0);
  char host[kHost] = {};
  ::gethostname(host, kHost - 1);
  MPI_Allgather(host, kHost, MPI_CHAR, all.data(), kHost, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.emplace_back(all.data() + size_t(r) * kHost);
  auto* c = new Communicator(options, dir, rank, size, std::move(hosts));
  MPI_Barrier(MPI_COMM_WORLD);  // every status file exists before anyone issues an operation
  g_instance.store(c);
  struct sigaction sa = {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  // A SIGTERM that only asks for a checkpoint returns: the system calls it interrupted go on.
  sa.sa_flags = SA_RESTART;
  g_sigterm_installed = sigaction(SIGTERM, &sa, &g_old_sigterm) == 0;
}

void shutdown_comm() {
  std::lock_guard<std::mutex> lock(g_init_m);
  Communicator* c = g_instance.load();
  if (!c) return;
  if (g_sigterm_installed) sigaction(SIGTERM, &g_old_sigterm, nullptr);
  g_sigterm_installed = false;
  c->stop();  // drains the queue while the instance is still visible
  g_instance.store(nullptr);
  delete c;
}

void Communicator::begin_capture() {
  std::lock_guard<std::mutex> lock(capture_m_);
  capturing_ = true;
  captured_.clear();
}

std::vector<CommRecord> Communicator::end_capture() {
  std::lock_guard<std::mutex> lock(capture_m_);
  capturing_ = false;
  return std::exchange(captured_, {});
}

void begin_comm_capture() { Communicator::get().begin_capture(); }
std::vector<CommRecord> end_comm_capture() { return Communicator::get().end_capture(); }

void sigterm_is_a_request(const char* answer) {
  g_sigterm_answer.store(answer);
  g_sigterm_saves.store(true);
}

bool sigterm_received() { return g_sigterms.load() > 0; }

std::string flight_recorder_report() {
  Communicator* c = Communicator::instance();
  return c ? c->recorder().report() : std::string("cleave comm: not initialised\n");
}

double Work::wait() {
  if (!state_) return 0;
  WorkState& s = *state_;
  double blocked = 0;
  if (!s.finished.load(std::memory_order_acquire)) {
    const auto t0 = std::chrono::steady_clock::now();
    Communicator* c = Communicator::instance();
    if (c) c->waiting_.fetch_add(1, std::memory_order_relaxed);
    {
      std::unique_lock<std::mutex> lock(s.m);
      s.cv.wait(lock, [&] { return s.finished.load(std::memory_order_acquire); });
    }
    if (c) c->waiting_.fetch_sub(1, std::memory_order_relaxed);
    blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (!s.error.empty())
    throw Error("cleave comm: " + std::string(op_name(s.op)) + " on group \"" + s.group +
                "\" failed: " + s.error);
  return blocked;
}

bool Work::done() const { return !state_ || state_->finished.load(std::memory_order_acquire); }

}  // namespace cleave
