#include "cleave/comm/status.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "cleave/base/check.h"

namespace cleave::comm_detail {

namespace {

constexpr uint64_t kMagic = 0x31535554414c4543ull;  // "CLEATUS1"

template <class T>
void store(T& field, T value) {
  __atomic_store(&field, &value, __ATOMIC_RELEASE);
}

uint64_t group_key(const std::string& name, const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](uint64_t b) {
    h ^= b;
    h *= 1099511628211ull;
  };
  for (char c : name) mix(uint8_t(c));
  for (int m : members)
    for (int i = 0; i < 4; ++i) mix(uint8_t(uint32_t(m) >> (8 * i)));
  return h ? h : 1;
}

// Formats "<dir>/rank-<r>.status" without allocating (used to build the paths once).
std::string status_path(const std::string& dir, int rank) {
  return dir + "/rank-" + std::to_string(rank) + ".status";
}

// 1: alive, 2: alive but stopped (SIGSTOP, a debugger: it does not run, so a stuck job's culprit),
// 0: dead (gone or zombie), -1: unknown (another host). Async-signal-safe.
int liveness(const StatusPage& p, const char* my_host) {
  if (std::strncmp(p.host, my_host, sizeof(p.host)) != 0) return -1;
  if (::kill(p.pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64];
  {
    // "/proc/<pid>/stat"
    char digits[16];
    int d = 0;
    for (uint32_t v = uint32_t(p.pid); v || d == 0; v /= 10) digits[d++] = char('0' + v % 10);
    size_t k = 0;
    for (const char* s = "/proc/"; *s;) path[k++] = *s++;
    while (d) path[k++] = digits[--d];
    for (const char* s = "/stat"; *s;) path[k++] = *s++;
    path[k] = 0;
  }
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return 0;
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  // state is the field after the ")" closing the command name
  for (ssize_t i = n - 1; i > 0; --i) {
    if (buf[i] != ')') continue;
    const char state = i + 2 < n ? buf[i + 2] : 'R';
    if (state == 'Z' || state == 'X') return 0;
    return state == 'T' || state == 't' ? 2 : 1;
  }
  return 1;
}

const char* state_text(int32_t s) {
  switch (RankState(s)) {
    case RankState::running: return "running";
    case RankState::finished: return "finished (shutdown_comm done)";
    case RankState::timed_out: return "timed out, aborting";
    case RankState::terminated: return "terminated by a signal";
    case RankState::failed: return "failed with an error";
    default: return "?";
  }
}

const StatusSlot* find_slot(const StatusPage& p, uint64_t key) {
  for (const StatusSlot& s : p.slots)
    if (s.key == key) return &s;
  return nullptr;
}

// A whole status page with its magic number, from a rank's file. Async-signal-safe.
bool read_page_file(const char* path, StatusPage& page) {
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return false;
  size_t got = 0;
  char* dst = reinterpret_cast<char*>(&page);
  while (got < sizeof(page)) {
    const ssize_t n = ::read(fd, dst + got, sizeof(page) - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fd);
  return got == sizeof(page) && page.magic == kMagic;
}

void sweep_stale_folders(const std::string& own) {
  // Ranks killed outright (SIGKILL: by mpirun when they take long to stop, or by the OOM killer)
  // run no code, so their job's folder outlives it. Each job start removes such folders beside its
  // own: every rank file of this host, of a process that is gone or has left. A folder of another
  // host's ranks, or of a process still running, stays.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path parent = fs::path(own).parent_path();
  char host[64] = {};
  ::gethostname(host, sizeof(host) - 1);
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("cleave-", 0) != 0 || entry.path() == fs::path(own) || !entry.is_directory(ec))
      continue;
    std::vector<fs::path> files;
    bool stale = true;
    for (const auto& f : fs::directory_iterator(entry.path(), ec)) {
      files.push_back(f.path());
      StatusPage page{};
      if (!read_page_file(f.path().c_str(), page)) {
        stale = false;
        continue;
      }
      // A stopped process (SIGSTOP, a debugger, strace holding a system call) is alive: removing
      // its folder would silence its report when it resumes.
      const int alive = liveness(page, host);
      if (alive == -1 || (alive != 0 && !page.left)) stale = false;
    }
    if (!stale || files.empty()) continue;  // an empty folder may be a job starting this moment
    for (const fs::path& f : files) fs::remove(f, ec);
    fs::remove(entry.path(), ec);
  }
}


}  // namespace

StatusBoard::StatusBoard(const std::string& dir, int world_rank, int world_size,
                         std::vector<std::string> hosts)
    : dir_(dir), hosts_(std::move(hosts)), world_rank_(world_rank), world_size_(world_size) {
  CLEAVE_CHECK(hosts_.empty() || int(hosts_.size()) == world_size,
               "StatusBoard: " << hosts_.size() << " host names for " << world_size << " ranks");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  CLEAVE_CHECK(std::filesystem::is_directory(dir_),
               "cannot create the comm status folder " << dir_ << ": " << ec.message());
  paths_.reserve(size_t(world_size));
  for (int r = 0; r < world_size; ++r) paths_.push_back(status_path(dir_, r));
  ::gethostname(host_, sizeof(host_) - 1);

  const std::string& path = paths_[size_t(world_rank)];
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  CLEAVE_CHECK(fd_ >= 0, "cannot create " << path << ": " << std::strerror(errno));
  CLEAVE_CHECK(::ftruncate(fd_, sizeof(StatusPage)) == 0,
               "cannot size " << path << ": " << std::strerror(errno));
  void* p = ::mmap(nullptr, sizeof(StatusPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  CLEAVE_CHECK(p != MAP_FAILED, "cannot map " << path << ": " << std::strerror(errno));
  page_ = static_cast<StatusPage*>(p);
  std::memset(static_cast<void*>(page_), 0, sizeof(StatusPage));
  page_->world_rank = world_rank;
  page_->world_size = world_size;
  page_->pid = int32_t(::getpid());
  std::memcpy(page_->host, host_, sizeof(page_->host));
  page_->init_time = page_->heartbeat = wall_seconds();
  page_->state = int32_t(RankState::running);
  store(page_->magic, kMagic);
  // Once per host: by its first rank.
  int first_here = world_rank;
  for (int r = 0; r < world_rank; ++r)
    if (!on_other_host(r)) {
      first_here = r;
      break;
    }
  if (first_here == world_rank) sweep_stale_folders(dir_);
}


StatusBoard::~StatusBoard() {
  if (page_) {
    set_state(RankState::finished);
    leave();
    ::munmap(page_, sizeof(StatusPage));
  }
  if (fd_ >= 0) ::close(fd_);
}

int StatusBoard::add_group(const std::string& name, const std::vector<int>& members, int rank) {
  for (int i = 0; i < kMaxStatusGroups; ++i) {
    StatusSlot& s = page_->slots[i];
    if (s.key != 0) continue;
    members_[i] = members;
    std::memset(&s, 0, sizeof(s));
    std::memcpy(s.name, name.data(), std::min(name.size(), sizeof(s.name) - 1));
    s.rank = rank;
    s.size = int32_t(members.size());
    store(s.key, group_key(name, members));
    return i;
  }
  return -1;
}

void StatusBoard::remove_group(int slot) {
  if (slot < 0) return;
  store(page_->slots[slot].key, uint64_t(0));
}

void StatusBoard::started(const WorkState& w) {
  if (w.slot < 0) return;
  StatusSlot& s = page_->slots[w.slot];
  if (w.kind == Kind::p2p) {
    store(s.p2p_started, s.p2p_started + 1);
    return;
  }
  store(s.op, int32_t(w.op));
  store(s.bytes, w.bytes);
  store(s.started_at, w.started_wall);
  store(s.started, w.seq);
}

void StatusBoard::completed(const WorkState& w) {
  if (w.slot < 0) return;
  StatusSlot& s = page_->slots[w.slot];
  if (w.kind == Kind::p2p) store(s.p2p_completed, s.p2p_completed + 1);
  else store(s.completed, w.seq);
}

void StatusBoard::heartbeat(double t) { store(page_->heartbeat, t); }

void StatusBoard::set_state(RankState s) { store(page_->state, int32_t(s)); }

RankState StatusBoard::state() const {
  int32_t s;
  __atomic_load(&page_->state, &s, __ATOMIC_ACQUIRE);
  return RankState(s);
}

int StatusBoard::failed_rank() const {
  StatusPage page;
  for (int r = 0; r < world_size_; ++r)
    if (r != world_rank_ && read_page(r, page) && page.state == int32_t(RankState::failed)) return r;
  return -1;
}

void StatusBoard::leave() {
  store(page_->left, int32_t(1));
  // Every rank marks itself before it looks at the others, so of ranks leaving at once the last to
  // look sees them all gone.
  if (others_gone()) remove_folder();
}

bool StatusBoard::others_gone() const {
  StatusPage page;
  for (int r = 0; r < world_size_; ++r)
    if (r != world_rank_ && read_page(r, page) && !page.left && liveness(page, host_) != 0)
      return false;
  return true;
}

bool StatusBoard::own_file_present() const {
  return ::access(paths_[size_t(world_rank_)].c_str(), F_OK) == 0;
}

void StatusBoard::remove_folder() {
  // This rank's file last: a rank that sees it gone knows its own is gone too (own_file_present).
  for (int r = 0; r < world_size_; ++r)
    if (r != world_rank_) ::unlink(paths_[size_t(r)].c_str());
  ::unlink(paths_[size_t(world_rank_)].c_str());
  ::rmdir(dir_.c_str());
}

bool StatusBoard::on_other_host(int rank) const {
  return !hosts_.empty() && std::strncmp(hosts_[size_t(rank)].c_str(), host_, sizeof(host_)) != 0;
}

bool StatusBoard::read_page(int rank, StatusPage& page) const {
  return read_page_file(paths_[size_t(rank)].c_str(), page);
}

void StatusBoard::write_report(SafeText& out, int focus_slot, uint64_t focus_seq,
                               Op focus_op) const {
  const double now = wall_seconds();
  out.str("cleave comm: status of the ").num(world_size_).str(" ranks (from ").str(dir_.c_str())
      .str("):\n");
  StatusPage page;
  for (int r = 0; r < world_size_; ++r) {
    out.str("  rank ").num(r).str(": ");
    if (!read_page(r, page)) {
      // Every file exists before the first operation (init_comm waits for all ranks), so on this
      // host a missing file means the rank finished. A rank on another host whose file is not
      // here most likely writes into a folder of its own host: nothing is known about it.
      if (on_other_host(r))
        out.str("on ").str(hosts_[size_t(r)].c_str()).str(", status UNKNOWN: no status file in ")
            .str(dir_.c_str()).str(" as seen from ").str(host_, sizeof(host_))
            .str(" (not shared between hosts? set parallel.status_dir to a folder every host "
                 "shares)\n");
      else
        out.str("no status file (not started yet, or already finished)\n");
      continue;
    }
    out.str("pid ").num(page.pid).str(" on ").str(page.host, sizeof(page.host)).str(", ");
    const int alive = liveness(page, host_);
    if (alive == 0) out.str("DEAD (the process is gone)");
    else out.str(state_text(page.state));
    if (alive == 2) out.str(", STOPPED (a signal or a debugger holds the process)");
    out.str(", heartbeat ").fixed(now > page.heartbeat ? now - page.heartbeat : 0, 1).str(" s ago\n");
    for (const StatusSlot& s : page.slots) {
      if (s.key == 0) continue;
      out.str("      group \"").str(s.name, sizeof(s.name)).str("\" (rank ").num(s.rank).str(" of ")
          .num(s.size).str("): ");
      if (s.started == 0) out.str("no collective started");
      else {
        out.str("started #").unum(s.started).chr(' ').str(op_name(Op(s.op))).str(" (")
            .bytes(s.bytes).str(")");
        if (s.completed < s.started) out.str(" ").fixed(now - s.started_at, 1).str(" s ago");
        out.str(", completed #").unum(s.completed);
      }
      out.str("; point-to-point started ").unum(s.p2p_started).str(", completed ")
          .unum(s.p2p_completed).chr('\n');
    }
  }
  if (focus_slot >= 0) {
    write_group_analysis(out, focus_slot, focus_seq, int(focus_op));
    return;
  }
  for (int i = 0; i < kMaxStatusGroups; ++i)
    if (page_ && page_->slots[i].key != 0) write_group_analysis(out, i, 0, -1);
}

// seq 0: the furthest sequence number any member started.
void StatusBoard::write_group_analysis(SafeText& out, int slot, uint64_t seq, int op) const {
  const StatusSlot& mine = page_->slots[slot];
  const std::vector<int>& members = members_[slot];
  StatusPage page;
  if (seq == 0) {
    for (int m : members)
      if (read_page(m, page))
        if (const StatusSlot* s = find_slot(page, mine.key); s && s->started > seq) {
          seq = s->started;
          if (op < 0 || m == world_rank_) op = s->op;
        }
    if (seq == 0) return;
  }
  out.str("cleave comm: group \"").str(mine.name, sizeof(mine.name)).str("\" (")
      .num(int64_t(members.size())).str(" ranks) at collective #").unum(seq);
  if (op >= 0) out.chr(' ').str(op_name(Op(op)));
  out.str(":\n");
  const GroupAt group{mine.key, int(members.size()), seq, op};
  uint64_t followed[kMaxFollowed] = {mine.key};
  int n_followed = 1;
  write_members(out, group, members.data(), int(members.size()), followed, n_followed);
}

// A member behind in the group may itself wait in a collective of another group, one this rank is
// not in (a host1 rank stuck in a group crossing to host2, say): that group is the one to look
// at, so the analysis follows it. Its members are those whose status page has its key; the ones
// whose page cannot be read here are candidates, named as such.
void StatusBoard::write_members(SafeText& out, const GroupAt& group, const int* members,
                                int n_members, uint64_t* followed, int& n_followed) const {
  enum { waiting, done, behind, stopped, dead, missing, unknown, mismatch, ncat };
  static const char* const labels[ncat] = {
      "    waiting in it:           ", "    done with it:            ",
      "    BEHIND (not started it): ", "    STOPPED (not running):   ",
      "    DEAD:                    ", "    MISSING (no status):     ",
      "    UNKNOWN (other host):    ", "    MISMATCH (another op):   "};
  // Without a member list every world rank is looked at: readable pages without the group's key
  // are not members, unreadable ones may be.
  const int n = members ? n_members : world_size_;
  int seen = 0, unseen = 0;  // without a member list: members found, and candidates not readable
  StatusPage page;
  for (int cat = 0; cat < ncat; ++cat) {
    bool any = false;
    for (int g = 0; g < n; ++g) {
      const int m = members ? members[g] : g;
      int c = on_other_host(m) ? unknown : missing;  // unless its file is readable
      const StatusSlot* s = nullptr;
      int alive = 1;
      const bool readable = read_page(m, page);  // if not, `page` still holds another rank's
      if (readable) {
        s = find_slot(page, group.key);
        if (!members && !s) continue;
        alive = liveness(page, host_);
        if (alive == 0) c = dead;
        else if (!s) c = missing;
        else if (alive == 2) c = stopped;
        else if (s->started < group.seq) c = behind;
        else if (s->started == group.seq && group.op >= 0 && s->op != group.op) c = mismatch;
        else if (s->completed >= group.seq) c = done;
        else c = waiting;
      }
      if (cat == 0) (readable ? seen : unseen) += 1;
      if (c != cat) continue;
      out.str(any ? ", " : labels[cat]);
      any = true;
      out.str("rank ").num(m);
      if (s && (c == behind || c == stopped || c == dead || c == mismatch)) {
        out.str(" (at #").unum(s->started).chr(' ').str(op_name(Op(s->op)));
        if (s->completed < s->started) out.str(", not completed");
        if (c == behind && alive == 1 && page.state == int32_t(RankState::running))
          out.str(", alive: stalled or desynchronised");
        out.chr(')');
      } else if (c == missing && readable && alive != 0) {
        out.str(" (has no group with this name and members)");
      } else if (c == unknown) {
        out.str(" (on ").str(hosts_[size_t(m)].c_str()).str(", status not visible here)");
      }
    }
    if (any) out.chr('\n');
  }
  if (!members && unseen > 0)
    out.str("    (").num(group.size - seen).str(" member(s) among those ").num(unseen)
        .str(" ranks without a status here)\n");
  // Then, once per group, where each live member behind is stuck instead.
  for (int g = 0; g < n; ++g) {
    const int m = members ? members[g] : g;
    // Alive, or on another host (its page readable through a shared folder): not dead or stopped.
    if (!read_page(m, page)) continue;
    if (const int alive = liveness(page, host_); alive == 0 || alive == 2) continue;
    const StatusSlot* s = find_slot(page, group.key);
    if (!s || s->started >= group.seq) continue;
    for (const StatusSlot& other : page.slots) {
      if (other.key == 0 || other.completed >= other.started || n_followed == kMaxFollowed) continue;
      bool done_before = false;
      for (int i = 0; i < n_followed; ++i) done_before |= followed[i] == other.key;
      if (done_before) continue;
      followed[n_followed++] = other.key;
      const GroupAt next{other.key, other.size, other.started, other.op};
      out.str("cleave comm: rank ").num(m).str(", behind, waits in group \"")
          .str(other.name, sizeof(other.name)).str("\" (").num(other.size)
          .str(" ranks) at collective #").unum(other.started).chr(' ').str(op_name(Op(other.op)))
          .str(":\n");
      write_members(out, next, nullptr, 0, followed, n_followed);
      break;
    }
  }
}

}  // namespace cleave::comm_detail
