// check_schedule: the static rules first (ranges, placement, one F and one backward per stage and
// micro-batch, sends paired with receives, the order of dependent actions on one rank), then a
// simulation in time of every rank's list, which finds the waits across ranks that never end.
#include <algorithm>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

namespace {

// Where an action stands: rank and position in that rank's list (rank -1: nowhere).
struct Pos {
  int rank = -1, index = -1;
  bool found() const { return rank >= 0; }
};

constexpr int kTypes = 8;

// Every action of a schedule by (type, stage, micro-batch); duplicates are errors.
class ActionIndex {
 public:
  explicit ActionIndex(const Schedule& s)
      : s_(s), pos_(size_t(kTypes) * s.n_stages * s.microbatches) {
    for (int r = 0; r < s.pp; ++r)
      for (int i = 0; i < int(s.ranks[r].size()); ++i) {
        Pos& p = pos_[key(s.ranks[r][i])];
        if (p.found())
          throw Error(to_string(s.ranks[r][i]) + " appears twice: " + where(p) + " and " +
                      where(Pos{r, i}));
        p = Pos{r, i};
      }
  }
  Pos operator()(ActionType t, int stage, int mb) const { return pos_[key(Action{t, stage, mb})]; }
  // "rank 1 action 4 (1F2)"
  std::string where(Pos p) const {
    return "rank " + std::to_string(p.rank) + " action " + std::to_string(p.index) + " (" +
           to_string(s_.ranks[p.rank][p.index]) + ")";
  }

 private:
  size_t key(const Action& a) const {
    return (size_t(a.type) * s_.n_stages + a.stage) * s_.microbatches + a.mb;
  }
  const Schedule& s_;
  std::vector<Pos> pos_;
};

void check_shape_and_ranges(const Schedule& s) {
  if (s.pp < 1 || s.n_stages < 1 || s.microbatches < 1)
    throw Error("schedule '" + s.name + "' needs pp, n_stages and microbatches >= 1 (got pp " +
                std::to_string(s.pp) + ", n_stages " + std::to_string(s.n_stages) +
                ", microbatches " + std::to_string(s.microbatches) + ")");
  if (int(s.ranks.size()) != s.pp)
    throw Error("schedule '" + s.name + "' has " + std::to_string(s.ranks.size()) +
                " rank lists for pp " + std::to_string(s.pp));
  for (int r = 0; r < s.pp; ++r)
    for (int i = 0; i < int(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      auto at = [&] {
        return "rank " + std::to_string(r) + " action " + std::to_string(i) + " (" +
               to_string(a) + ")";
      };
      if (a.stage < 0 || a.stage >= s.n_stages)
        throw Error(at() + " names stage " + std::to_string(a.stage) + ", but the schedule has " +
                    std::to_string(s.n_stages) + " stages (0.." + std::to_string(s.n_stages - 1) +
                    ")");
      if (a.mb < 0 || a.mb >= s.microbatches)
        throw Error(at() + " names micro-batch " + std::to_string(a.mb) +
                    ", but the schedule has " + std::to_string(s.microbatches) +
                    " micro-batches (0.." + std::to_string(s.microbatches - 1) + ")");
    }
}

// The rank of each stage, read off its compute actions.
StageMap read_placement(const Schedule& s) {
  StageMap m;
  m.rank_of_stage.assign(s.n_stages, -1);
  std::vector<Pos> first(s.n_stages);
  for (int r = 0; r < s.pp; ++r)
    for (int i = 0; i < int(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      if (!is_compute(a.type)) continue;
      int& owner = m.rank_of_stage[a.stage];
      if (owner >= 0 && owner != r) {
        const Pos f = first[a.stage];
        throw Error("stage " + std::to_string(a.stage) + " is computed on two ranks: rank " +
                    std::to_string(f.rank) + " action " + std::to_string(f.index) + " (" +
                    to_string(s.ranks[f.rank][f.index]) + ") and rank " + std::to_string(r) +
                    " action " + std::to_string(i) + " (" + to_string(a) + ")");
      }
      if (owner < 0) first[a.stage] = Pos{r, i};
      owner = r;
    }
  std::vector<int> count(s.pp, 0);
  m.chunk_of_stage.assign(s.n_stages, 0);
  for (int st = 0; st < s.n_stages; ++st) {
    const int r = m.rank_of_stage[st];
    if (r < 0) throw Error("stage " + std::to_string(st) + " has no compute action on any rank");
    m.chunk_of_stage[st] = count[r]++;
  }
  for (int r = 0; r < s.pp; ++r)
    if (count[r] == 0) throw Error("rank " + std::to_string(r) + " computes no stage");
  m.chunks_per_rank = *std::max_element(count.begin(), count.end());
  return m;
}

// One F per stage and micro-batch, and either one B or one I and one W.
void check_compute_counts(const Schedule& s, const ActionIndex& at) {
  for (int st = 0; st < s.n_stages; ++st)
    for (int mb = 0; mb < s.microbatches; ++mb) {
      auto what = [&] {
        return "micro-batch " + std::to_string(mb) + " of stage " + std::to_string(st);
      };
      auto text = [&](ActionType t) { return to_string(Action{t, st, mb}); };
      const Pos b = at(ActionType::backward, st, mb), i = at(ActionType::backward_input, st, mb),
                w = at(ActionType::backward_weight, st, mb);
      if (!at(ActionType::forward, st, mb).found())
        throw Error(what() + " has no forward: no rank runs " + text(ActionType::forward));
      if (!b.found() && !i.found())
        throw Error(what() + " has no backward: no rank runs " + text(ActionType::backward) +
                    " or " + text(ActionType::backward_input));
      if (b.found() && i.found())
        throw Error(what() + " has both a whole backward, " + at.where(b) +
                    ", and a backward input, " + at.where(i));
      if (w.found() && !i.found())
        throw Error(at.where(w) + " has no backward input " + text(ActionType::backward_input) +
                    " before it (" + text(ActionType::backward) + " computes the weight gradient)");
      if (i.found() && !w.found())
        throw Error(at.where(i) + " has no weight gradient " + text(ActionType::backward_weight) +
                    " after it");
    }
}

// The stage at the other end of a send or receive: next for SEND_F and RECV_B, previous for
// RECV_F and SEND_B.
int peer_stage(const Action& a) {
  return a.type == ActionType::send_forward || a.type == ActionType::recv_backward ? a.stage + 1
                                                                                   : a.stage - 1;
}

// Each send and receive is on its stage's rank, towards a stage on another rank.
void check_comm_placement(const Schedule& s, const StageMap& m, const ActionIndex& at) {
  for (int r = 0; r < s.pp; ++r)
    for (int i = 0; i < int(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      if (is_compute(a.type)) continue;
      auto here = [&] { return at.where(Pos{r, i}); };
      const int peer = peer_stage(a);
      if (peer < 0 || peer >= s.n_stages)
        throw Error(here() + " has no peer: stage " + std::to_string(a.stage) + " is the " +
                    (peer < 0 ? "first" : "last") + " stage");
      if (m.rank_of_stage[a.stage] != r)
        throw Error(here() + " is on rank " + std::to_string(r) + ", but stage " +
                    std::to_string(a.stage) + " runs on rank " +
                    std::to_string(m.rank_of_stage[a.stage]));
      if (m.rank_of_stage[peer] == r)
        throw Error(here() + " is between stages " + std::to_string(a.stage) + " and " +
                    std::to_string(peer) + ", both on rank " + std::to_string(r) +
                    ", which hand over without a send or receive");
    }
}

// Across a boundary between ranks, each micro-batch's send has its receive and the other way.
void check_pairs(const Schedule& s, const StageMap& m, const ActionIndex& at) {
  for (int st = 0; st + 1 < s.n_stages; ++st) {
    const int lo = m.rank_of_stage[st], hi = m.rank_of_stage[st + 1];
    if (lo == hi) continue;
    for (int mb = 0; mb < s.microbatches; ++mb) {
      // Forward: stage st sends to st + 1. Backward: st + 1 sends to st.
      struct Link {
        ActionType send, recv;
        int from_stage, to_stage, from_rank, to_rank;
        Pos consumer;
      };
      const Pos back = at(ActionType::backward, st, mb).found()
                           ? at(ActionType::backward, st, mb)
                           : at(ActionType::backward_input, st, mb);
      const Link links[2] = {
          {ActionType::send_forward, ActionType::recv_forward, st, st + 1, lo, hi,
           at(ActionType::forward, st + 1, mb)},
          {ActionType::send_backward, ActionType::recv_backward, st + 1, st, hi, lo, back},
      };
      for (const Link& l : links) {
        const Action send = Action{l.send, l.from_stage, mb}, recv = Action{l.recv, l.to_stage, mb};
        const Pos sp = at(l.send, l.from_stage, mb), rp = at(l.recv, l.to_stage, mb);
        if (!sp.found())
          throw Error("rank " + std::to_string(l.to_rank) + " waits at action " +
                      std::to_string(l.consumer.index) + " (" +
                      to_string(s.ranks[l.consumer.rank][l.consumer.index]) + ") for " +
                      to_string(send) + ", which rank " + std::to_string(l.from_rank) +
                      " never runs");
        if (!rp.found())
          throw Error(at.where(sp) + " has no matching receive: rank " +
                      std::to_string(l.to_rank) + " never posts " + to_string(recv) +
                      " for its " + to_string(s.ranks[l.consumer.rank][l.consumer.index]) +
                      " (action " + std::to_string(l.consumer.index) + ")");
      }
    }
  }
}

// On one rank, what an action needs from that same rank must come earlier in its list.
void check_local_order(const Schedule& s, const StageMap& m, const ActionIndex& at) {
  auto before = [&](Pos need, int rank, int index, const std::string& why) {
    if (need.index < index) return;
    throw Error("rank " + std::to_string(rank) + " action " + std::to_string(index) + " (" +
                to_string(s.ranks[rank][index]) + ") runs before " + why + " " +
                to_string(s.ranks[need.rank][need.index]) + " (action " +
                std::to_string(need.index) + ")");
  };
  auto posted_late = [&](Pos recv, int rank, int index) {
    if (recv.index < index) return;
    throw Error(at.where(recv) + " is posted after the compute that waits for it, " +
                to_string(s.ranks[rank][index]) + " (action " + std::to_string(index) + ")");
  };
  for (int r = 0; r < s.pp; ++r)
    for (int i = 0; i < int(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      const int st = a.stage, mb = a.mb;
      switch (a.type) {
        case ActionType::forward:
          if (st == 0) break;
          if (m.rank_of_stage[st - 1] == r)
            before(at(ActionType::forward, st - 1, mb), r, i, "the forward whose output it takes,");
          else
            posted_late(at(ActionType::recv_forward, st, mb), r, i);
          break;
        case ActionType::backward:
        case ActionType::backward_input:
          before(at(ActionType::forward, st, mb), r, i, "its forward");
          if (st + 1 == s.n_stages) break;
          if (m.rank_of_stage[st + 1] == r) {
            const Pos b = at(ActionType::backward, st + 1, mb);
            before(b.found() ? b : at(ActionType::backward_input, st + 1, mb), r, i,
                   "the backward whose input gradient it takes,");
          } else {
            posted_late(at(ActionType::recv_backward, st, mb), r, i);
          }
          break;
        case ActionType::backward_weight:
          before(at(ActionType::backward_input, st, mb), r, i, "its backward input");
          break;
        case ActionType::send_forward:
          before(at(ActionType::forward, st, mb), r, i, "the forward it sends,");
          break;
        case ActionType::send_backward: {
          const Pos b = at(ActionType::backward, st, mb);
          before(b.found() ? b : at(ActionType::backward_input, st, mb), r, i,
                 "the backward it sends,");
          break;
        }
        case ActionType::recv_forward:
        case ActionType::recv_backward:
          break;
      }
    }
}

double cost_of(ActionType t, const ActionCosts& c) {
  switch (t) {
    case ActionType::forward: return c.forward;
    case ActionType::backward: return c.backward_input + c.backward_weight;
    case ActionType::backward_input: return c.backward_input;
    case ActionType::backward_weight: return c.backward_weight;
    default: return 0;
  }
}

// The send a compute action waits for: its neighbour stage's, when that stage is on another rank.
Pos remote_dependency(const Schedule& s, const StageMap& m, const ActionIndex& at,
                      const Action& a) {
  const int r = m.rank_of_stage[a.stage];
  if (a.type == ActionType::forward && a.stage > 0 && m.rank_of_stage[a.stage - 1] != r)
    return at(ActionType::send_forward, a.stage - 1, a.mb);
  if ((a.type == ActionType::backward || a.type == ActionType::backward_input) &&
      a.stage + 1 < s.n_stages && m.rank_of_stage[a.stage + 1] != r)
    return at(ActionType::send_backward, a.stage + 1, a.mb);
  return Pos{};
}

// Runs every rank's list in time: an action starts when its rank is free and the send it waits
// for has run. The order in which ranks are advanced does not change any time.
void simulate(const Schedule& s, const StageMap& m, const ActionIndex& at,
              const ActionCosts& costs, ScheduleCheck& out) {
  std::vector<std::vector<Pos>> dep(s.pp);
  std::vector<std::vector<double>> done(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : s.ranks[r]) dep[r].push_back(remote_dependency(s, m, at, a));
    done[r].assign(s.ranks[r].size(), 0);
    out.start.emplace_back(s.ranks[r].size(), -1.0);
    out.end.emplace_back(s.ranks[r].size(), -1.0);
  }
  std::vector<int> pc(s.pp, 0);
  std::vector<double> free_at(s.pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r)
      for (; pc[r] < int(s.ranks[r].size()); ++pc[r], progress = true) {
        const Pos d = dep[r][pc[r]];
        if (d.found() && pc[d.rank] <= d.index) break;
        const Action& a = s.ranks[r][pc[r]];
        const double start = std::max(free_at[r], d.found() ? done[d.rank][d.index] : 0.0);
        free_at[r] = done[r][pc[r]] = start + cost_of(a.type, costs);
        if (is_compute(a.type)) {
          out.start[r][pc[r]] = start;
          out.end[r][pc[r]] = free_at[r];
        }
      }
  }
  std::string stuck;
  auto waits = [&](int r) {
    const Pos d = dep[r][pc[r]];
    return "rank " + std::to_string(r) + " waits at action " + std::to_string(pc[r]) + " (" +
           to_string(s.ranks[r][pc[r]]) + ") for " + to_string(s.ranks[d.rank][d.index]);
  };
  for (int r = 0; r < s.pp; ++r) {
    if (pc[r] == int(s.ranks[r].size())) continue;
    const int q = dep[r][pc[r]].rank;
    stuck += (stuck.empty() ? "" : "; ") + waits(r) + ", which rank " + std::to_string(q) +
             " has not run (" + waits(q) + ")";
  }
  if (!stuck.empty()) throw Error("schedule '" + s.name + "' deadlocks: " + stuck);
  out.makespan = *std::max_element(free_at.begin(), free_at.end());
}

// Per rank and local chunk: micro-batches forwarded whose last backward action has not run.
void count_in_flight(const Schedule& s, ScheduleCheck& out) {
  const StageMap& m = out.stages;
  out.max_in_flight.assign(s.pp, std::vector<int>(m.chunks_per_rank, 0));
  for (int r = 0; r < s.pp; ++r) {
    std::vector<int> now(m.chunks_per_rank, 0);
    for (const Action& a : s.ranks[r]) {
      const int c = m.chunk_of_stage[a.stage];
      if (a.type == ActionType::forward)
        out.max_in_flight[r][c] = std::max(out.max_in_flight[r][c], ++now[c]);
      else if (a.type == ActionType::backward || a.type == ActionType::backward_weight)
        --now[c];
    }
  }
}

}  // namespace

ScheduleCheck check_schedule(const Schedule& s, const ActionCosts& costs) {
  if (costs.forward < 0 || costs.backward_input < 0 || costs.backward_weight < 0)
    throw Error("action costs must be >= 0 (got F " + std::to_string(costs.forward) + ", I " +
                std::to_string(costs.backward_input) + ", W " +
                std::to_string(costs.backward_weight) + ")");
  check_shape_and_ranges(s);
  ScheduleCheck out;
  out.stages = read_placement(s);
  const ActionIndex at(s);
  check_compute_counts(s, at);
  check_comm_placement(s, out.stages, at);
  check_pairs(s, out.stages, at);
  check_local_order(s, out.stages, at);
  simulate(s, out.stages, at, costs, out);
  count_in_flight(s, out);
  return out;
}

}  // namespace cleave
