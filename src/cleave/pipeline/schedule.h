// A pipeline schedule as data (docs/pipeline_parallel.md): per rank, the list of actions it runs
// for one training step, as in DeepSpeed's PipeSchedule and PyTorch's pipelining actions. The
// model's layer stack is cut into n_stages stages (pp ranks x virtual chunks per rank); a stage
// runs on exactly one rank. Generators build the frontier schedules, CSV files carry hand-written
// ones, and check() simulates any of them before it runs. No MPI here: this is pure data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

enum class ActionType {
  forward,          // F: the stage's forward of a micro-batch
  backward,         // B: input and weight gradients together
  backward_input,   // I: the input gradient only (zero-bubble schedules)
  backward_weight,  // W: the weight gradient, after its I
  send_forward,     // SEND_F: the stage's output activations to the next stage's rank
  recv_forward,     // RECV_F: post the receive of the stage's input activations
  send_backward,    // SEND_B: the gradient of the stage's input to the previous stage's rank
  recv_backward,    // RECV_B: post the receive of the gradient of the stage's output
};

inline bool is_compute(ActionType t) {
  return t == ActionType::forward || t == ActionType::backward ||
         t == ActionType::backward_input || t == ActionType::backward_weight;
}

// One action: what, on which stage (global index 0..n_stages-1) and micro-batch. In text (the
// CSV cells, PyTorch's notation) it is <stage><type><mb>: "0F3", "2I0", "1SEND_F2", "3RECV_B1".
struct Action {
  ActionType type = ActionType::forward;
  int stage = 0;
  int mb = 0;
  bool operator==(const Action&) const = default;
};

std::string to_string(const Action& a);
// Throws cleave::Error naming the text when it is not an action.
Action parse_action(const std::string& text);

// Sends and receives are posted, never waited on where they stand: a receive is waited for by
// the compute that consumes it (F for RECV_F, B or I for RECV_B), a send's buffer is kept until
// the step ends. Adjacent stages on one rank hand over locally and have no send/recv.
struct Schedule {
  std::string name;  // "gpipe", "1f1b", "interleaved", "zb1p", "zbv", or the CSV's path
  int pp = 1;           // ranks
  int n_stages = 1;     // pp x virtual chunks
  int microbatches = 1;
  std::vector<std::vector<Action>> ranks;  // one list per pp rank, in execution order
};

// The rank that runs each stage, and which of its local chunks the stage is (chunks of a rank
// are numbered in increasing stage order).
struct StageMap {
  std::vector<int> rank_of_stage;
  std::vector<int> chunk_of_stage;
  int chunks_per_rank = 1;
};
// Looped placement (gpipe, 1f1b, zb1p, interleaved): stage s on rank s % pp. V placement (zbv):
// stage s on rank s for s < pp, on rank 2 pp - 1 - s after.
StageMap looped_stages(int pp, int virtual_chunks);
StageMap v_stages(int pp);

// The known generators by name (`parallel.pp_schedule`); virtual_chunks is used by interleaved
// (>= 2) and must be 2 for zbv. Throws cleave::Error naming the numbers when the schedule cannot
// be built: fewer micro-batches than it needs, an unknown name, virtual chunks it does not take.
Schedule generate_schedule(const std::string& name, int pp, int microbatches, int virtual_chunks);
std::vector<std::string> schedule_names();

// CSV: one row per rank, one action per cell (docs/pipeline_parallel.md). pp, n_stages and
// microbatches are read off the actions (pp = rows). Errors name the file, row and cell.
Schedule load_schedule_csv(const std::string& path);
void save_schedule_csv(const Schedule& s, const std::string& path);

// What check() learns by simulating the schedule.
struct ScheduleCheck {
  StageMap stages;                       // read off the compute actions
  // Per rank and local chunk: the most micro-batches whose forward ran and whose last backward
  // action (B, or W) has not: the activation slots that chunk needs.
  std::vector<std::vector<int>> max_in_flight;
  // The simulated timeline (compute actions only): start and end in abstract time units per
  // action of each rank, with F = 1, B = 2, I = 1, W = 1 unless given; -1 for send/recv.
  std::vector<std::vector<double>> start, end;
  double makespan = 0;
};
struct ActionCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;  // B costs I + W
};

// Simulates every rank's list. Throws cleave::Error naming the rank, the action (by position
// and text) and what it waits for when: an action names a stage or micro-batch out of range, a
// stage's compute appears on two ranks, a micro-batch's F, B, I or W is missing or repeated on
// its stage, a recv has no matching send (or a send no recv), a backward precedes its forward or
// a W its I, a stage adjacent to one on another rank lacks its send/recv, or the ranks deadlock
// (a cycle of waits: every rank stuck, each waiting for another).
ScheduleCheck check_schedule(const Schedule& s, const ActionCosts& costs = {});

// The timeline as text, one row per rank (what `cleave schedule` prints), and as a Chrome trace
// (JSON, viewable in Perfetto): one track per rank.
std::string timeline_text(const Schedule& s, const ScheduleCheck& c);
struct TraceEvent {
  int rank = 0;
  std::string name;
  double start_us = 0, duration_us = 0;
  // A communication operation (bytes >= 0): drawn on the rank's second track, "rank R comm",
  // with its bytes and group.
  int64_t bytes = -1;
  std::string group;
};
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events);
std::vector<TraceEvent> simulated_trace(const Schedule& s, const ScheduleCheck& c,
                                        double us_per_unit = 1000);

}  // namespace cleave
