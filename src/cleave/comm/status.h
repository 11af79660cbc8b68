// Published progress: each rank keeps a small status file (mmapped, rewritten in place) in the job's
// status folder: per group, the last collective started and completed (sequence number, op, bytes)
// and its point-to-point counts, plus the pid, host and a heartbeat. Other ranks read the files
// without MPI, so a rank whose collective times out, or that is being killed because another rank
// died, can say which rank stopped where. The folder must be shared by the ranks that should see
// each other (the default, /tmp/cleave-<id>, is per host); a rank whose file cannot be read from a
// rank on another host is reported as unknown, never as dead or behind. The job leaves no folder
// behind, however it ends: the last rank to be done with it removes it (see leave()).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cleave/comm/internal.h"

namespace cleave::comm_detail {

constexpr int kMaxStatusGroups = 32;

struct StatusSlot {
  uint64_t key;  // identifies the group across ranks (name + members); 0: free slot
  char name[40];
  int32_t rank, size;
  uint64_t started, completed;  // collective sequence numbers, 1-based; 0: none yet
  int32_t op, reserved;         // op of the last collective started
  int64_t bytes;
  double started_at;            // wall seconds
  uint64_t p2p_started, p2p_completed;
};

// failed: the rank ends the job for an error of its own, which it reported (MPI_Abort follows).
enum class RankState : int32_t {
  none = 0, running = 1, finished = 2, timed_out = 3, terminated = 4, failed = 5
};

struct StatusPage {
  uint64_t magic;
  int32_t world_rank, world_size, pid, state;
  int32_t left;  // 1 once the rank reads the folder no more (leave())
  char host[64];
  double init_time, heartbeat;  // wall seconds
  StatusSlot slots[kMaxStatusGroups];
};

class StatusBoard {
 public:
  // Creates the folder if needed and this rank's file. `hosts`: the host name of every world rank
  // (gathered at init), so that a rank whose file is not visible here can be placed; empty: not
  // known (every rank is then taken to be on this host).
  StatusBoard(const std::string& dir, int world_rank, int world_size,
              std::vector<std::string> hosts = {});
  ~StatusBoard();  // marks this rank finished and leaves
  StatusBoard(const StatusBoard&) = delete;
  StatusBoard& operator=(const StatusBoard&) = delete;

  const std::string& dir() const { return dir_; }
  // `members`: world ranks of the group, in group rank order. Returns the slot, -1 when all slots
  // are taken (the group then runs unpublished).
  int add_group(const std::string& name, const std::vector<int>& members, int rank);
  void remove_group(int slot);
  void started(const WorkState& w);
  void completed(const WorkState& w);
  void heartbeat(double t);
  void set_state(RankState s);  // async-signal-safe
  RankState state() const;

  // Async-signal-safe. A rank whose status says it failed with an error (RankState::failed), or -1.
  int failed_rank() const;
  // Async-signal-safe. Whether this rank's file is still there: a rank that failed with an error
  // removes the folder before it aborts the job, so a rank that finds its file gone is being
  // stopped for an error already reported.
  bool own_file_present() const;
  // Async-signal-safe. Whether every other rank has left the folder or died.
  bool others_gone() const;
  // Async-signal-safe. Removes every rank's file, this rank's last, then the folder.
  void remove_folder();
  // Async-signal-safe. This rank reads the folder no more (its file stays: other ranks' reports
  // still read its state). The last rank to leave, the others having left or died, removes every
  // file and the folder.
  void leave();

  // Async-signal-safe. The progress of every rank read from the status files; then, for the group
  // in `focus_slot` (or, with -1, for each of this rank's groups at the furthest sequence number any
  // member started), which members are waiting in it, done, behind, dead, missing or running a
  // different op.
  void write_report(SafeText& out, int focus_slot, uint64_t focus_seq, Op focus_op) const;

 private:
  bool read_page(int rank, StatusPage& page) const;
  bool on_other_host(int rank) const;  // known to run on another host than this rank
  void write_group_analysis(SafeText& out, int slot, uint64_t seq, int op) const;
  struct GroupAt {
    uint64_t key;
    int size;
    uint64_t seq;  // the collective looked at
    int op;        // its op, or -1
  };
  static constexpr int kMaxFollowed = 8;  // groups one analysis looks at, the first included
  // members == nullptr: not known here (a group of another rank); found by key in every page.
  // `followed`: keys of the groups already analysed (kMaxFollowed at most).
  void write_members(SafeText& out, const GroupAt& group, const int* members, int n_members,
                     uint64_t* followed, int& n_followed) const;

  std::string dir_;
  std::vector<std::string> paths_;  // status file of every world rank (built once: no allocation later)
  std::vector<std::string> hosts_;  // host of every world rank; empty: not known
  int world_rank_, world_size_;
  char host_[64] = {};
  StatusPage* page_ = nullptr;      // this rank's file, mmapped
  int fd_ = -1;
  std::vector<int> members_[kMaxStatusGroups];
};

}  // namespace cleave::comm_detail
