// The schedule generators. Each builds the order of the compute actions of every rank; the sends
// and receives are then placed the same way for all of them (with_communication).
#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "cleave/base/check.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

namespace {

using Lists = std::vector<std::vector<Action>>;

bool is_backward(ActionType t) {
  return t == ActionType::backward || t == ActionType::backward_input;
}

// The receive a compute action consumes, if its neighbour stage is on another rank.
bool receive_of(const Action& a, const StageMap& map, Action& recv) {
  const int n = int(map.rank_of_stage.size()), s = a.stage, r = map.rank_of_stage[s];
  if (a.type == ActionType::forward && s > 0 && map.rank_of_stage[s - 1] != r) {
    recv = Action{ActionType::recv_forward, s, a.mb};
    return true;
  }
  if (is_backward(a.type) && s + 1 < n && map.rank_of_stage[s + 1] != r) {
    recv = Action{ActionType::recv_backward, s, a.mb};
    return true;
  }
  return false;
}

// The send of what a compute action produces, if the consuming stage is on another rank.
bool send_of(const Action& a, const StageMap& map, Action& send) {
  const int n = int(map.rank_of_stage.size()), s = a.stage, r = map.rank_of_stage[s];
  if (a.type == ActionType::forward && s + 1 < n && map.rank_of_stage[s + 1] != r) {
    send = Action{ActionType::send_forward, s, a.mb};
    return true;
  }
  if (is_backward(a.type) && s > 0 && map.rank_of_stage[s - 1] != r) {
    send = Action{ActionType::send_backward, s, a.mb};
    return true;
  }
  return false;
}

// Each send goes right after the compute that produces its tensor, so the peer can start as soon
// as possible; each receive is posted before the compute that precedes its consumer, so the
// transfer overlaps that compute while only a couple of receives are outstanding per rank.
Schedule with_communication(const std::string& name, int pp, int microbatches,
                            const StageMap& map, const Lists& compute) {
  Schedule s;
  s.name = name;
  s.pp = pp;
  s.n_stages = int(map.rank_of_stage.size());
  s.microbatches = microbatches;
  s.ranks.resize(pp);
  for (int r = 0; r < pp; ++r) {
    const std::vector<Action>& c = compute[r];
    std::vector<Action>& out = s.ranks[r];
    Action comm;
    if (!c.empty() && receive_of(c[0], map, comm)) out.push_back(comm);
    for (size_t k = 0; k < c.size(); ++k) {
      if (k + 1 < c.size() && receive_of(c[k + 1], map, comm)) out.push_back(comm);
      out.push_back(c[k]);
      if (send_of(c[k], map, comm)) out.push_back(comm);
    }
  }
  return s;
}

Lists gpipe(int pp, int m) {
  Lists c(pp);
  for (int r = 0; r < pp; ++r) {
    for (int i = 0; i < m; ++i) c[r].push_back(Action{ActionType::forward, r, i});
    for (int i = 0; i < m; ++i) c[r].push_back(Action{ActionType::backward, r, i});
  }
  return c;
}

// 1F1B (PipeDream-Flush, Narayanan et al. 2021): rank r runs pp - r - 1 forwards ahead, then
// alternates one forward and one backward, then drains the backwards. With zero_bubble the
// backward is split (ZB-H1, Qi et al. 2023): I takes B's place and rank r holds back its first r
// weight gradients, running W(k - r) after I(k) and the last r at the end. The held-back Ws fill
// the cool-down, where each I now waits only for the next rank's I, and rank r's activations in
// flight peak at min(pp, m), as on rank 0 of 1F1B.
Lists one_f_one_b(int pp, int m, bool zero_bubble) {
  Lists c(pp);
  const ActionType back = zero_bubble ? ActionType::backward_input : ActionType::backward;
  for (int r = 0; r < pp; ++r) {
    std::vector<Action>& l = c[r];
    const int lag = zero_bubble ? r : 0;
    const int warmup = std::min(pp - r - 1, m);
    auto backward = [&](int k) {
      l.push_back(Action{back, r, k});
      if (zero_bubble && k >= lag) l.push_back(Action{ActionType::backward_weight, r, k - lag});
    };
    for (int i = 0; i < warmup; ++i) l.push_back(Action{ActionType::forward, r, i});
    for (int i = 0; i < m - warmup; ++i) {
      l.push_back(Action{ActionType::forward, r, warmup + i});
      backward(i);
    }
    for (int k = m - warmup; k < m; ++k) backward(k);
    if (zero_bubble)
      for (int k = std::max(m - lag, 0); k < m; ++k)
        l.push_back(Action{ActionType::backward_weight, r, k});
  }
  return c;
}

// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, forward_backward_pipelining_with_
// interleaving): rank r holds stages r, r + pp, ... (v chunks). Its k-th forward runs chunk
// (k mod pp v) / pp on micro-batch (k / pp v) pp + k mod pp, pp micro-batches per chunk in turn;
// its k-th backward runs the chunks in the reverse order. Warm-up: (pp - r - 1) 2 + (v - 1) pp
// forwards, all of them when m = pp.
Lists interleaved(int pp, int m, int v) {
  Lists c(pp);
  const int total = m * v, group = pp * v;
  for (int r = 0; r < pp; ++r) {
    auto mb = [&](int k) { return (k / group) * pp + k % pp; };
    auto forward = [&](int k) {
      c[r].push_back(Action{ActionType::forward, ((k % group) / pp) * pp + r, mb(k)});
    };
    auto backward = [&](int k) {
      c[r].push_back(Action{ActionType::backward, (v - 1 - (k % group) / pp) * pp + r, mb(k)});
    };
    const int warmup = m == pp ? total : std::min((pp - r - 1) * 2 + (v - 1) * pp, total);
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int i = 0; i < total - warmup; ++i) {
      forward(warmup + i);
      backward(i);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return c;
}

// The V schedule of DualPipe-V (deepseek-ai/DualPipe, dualpipev.py; the V-shape of Qi et al.
// 2024, PyTorch's ScheduleZBVZeroBubble). Rank r holds chunk 0 = stage r (the way down) and
// chunk 1 = stage 2 pp - 1 - r (the way back up), so rank 0 holds the first and the last stage.
// Eight phases, as DualPipe-V counts them: forwards of chunk 0 to fill the way down, then both
// chunks, then chunk 1's first backwards (split, their W run at once), the steady F0 B1 F1 B0,
// the drain, and at the end split backwards whose Ws fill the cool-down.
Lists zbv(int pp, int m) {
  Lists c(pp);
  for (int r = 0; r < pp; ++r) {
    std::vector<Action>& l = c[r];
    const int stage[2] = {r, 2 * pp - 1 - r};
    int f[2] = {0, 0}, b[2] = {0, 0};
    std::deque<Action> held;  // weight gradients not yet run, oldest first
    auto forward = [&](int chunk) {
      l.push_back(Action{ActionType::forward, stage[chunk], f[chunk]++});
    };
    auto backward = [&](int chunk, bool split) {
      const int mb = b[chunk]++;
      if (!split) {
        l.push_back(Action{ActionType::backward, stage[chunk], mb});
        return;
      }
      l.push_back(Action{ActionType::backward_input, stage[chunk], mb});
      held.push_back(Action{ActionType::backward_weight, stage[chunk], mb});
    };
    auto weight = [&] {
      l.push_back(held.front());
      held.pop_front();
    };
    for (int i = 0; i < 2 * (pp - r - 1); ++i) forward(0);
    for (int i = 0; i < r + 1; ++i) {
      forward(0);
      forward(1);
    }
    for (int i = 0; i < pp - r - 1; ++i) {
      backward(1, true);
      weight();
      forward(1);
    }
    for (int i = 0; i < m - 2 * pp + r + 1; ++i) {
      forward(0);
      backward(1, false);
      forward(1);
      backward(0, false);
    }
    for (int i = 0; i < pp - r - 1; ++i) {
      backward(1, false);
      forward(1);
      backward(0, false);
    }
    // The second half of these backwards defer their W (from chunk 1 on odd ranks, from chunk 0
    // on even ones, so neighbours alternate).
    bool split = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      backward(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      backward(0, split);
    }
    for (int i = 0; i < pp - r - 1; ++i) {
      weight();
      backward(0, true);
    }
    while (!held.empty()) weight();
  }
  return c;
}

void require_one_chunk(const std::string& name, int virtual_chunks) {
  if (virtual_chunks != 1)
    throw Error(name + " runs one chunk per rank: virtual chunks must be 1 (got " +
                std::to_string(virtual_chunks) + ")");
}

}  // namespace

StageMap looped_stages(int pp, int virtual_chunks) {
  CLEAVE_CHECK(pp >= 1 && virtual_chunks >= 1,
               "pp " << pp << " and virtual chunks " << virtual_chunks << " must be >= 1");
  StageMap m;
  m.chunks_per_rank = virtual_chunks;
  for (int s = 0; s < pp * virtual_chunks; ++s) {
    m.rank_of_stage.push_back(s % pp);
    m.chunk_of_stage.push_back(s / pp);
  }
  return m;
}

StageMap v_stages(int pp) {
  CLEAVE_CHECK(pp >= 1, "pp " << pp << " must be >= 1");
  StageMap m;
  m.chunks_per_rank = 2;
  for (int s = 0; s < 2 * pp; ++s) {
    m.rank_of_stage.push_back(s < pp ? s : 2 * pp - 1 - s);
    m.chunk_of_stage.push_back(s < pp ? 0 : 1);
  }
  return m;
}

std::vector<std::string> schedule_names() {
  return {"gpipe", "1f1b", "interleaved", "zb1p", "zbv"};
}

Schedule generate_schedule(const std::string& name, int pp, int microbatches, int virtual_chunks) {
  const std::vector<std::string> names = schedule_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown pipeline schedule '" + name + "' (known: " + known + ")");
  }
  if (pp < 1 || microbatches < 1)
    throw Error(name + " needs pp >= 1 and microbatches >= 1 (got pp " + std::to_string(pp) +
                ", microbatches " + std::to_string(microbatches) + ")");
  const int m = microbatches;
  if (name == "gpipe") {
    require_one_chunk(name, virtual_chunks);
    return with_communication(name, pp, m, looped_stages(pp, 1), gpipe(pp, m));
  }
  if (name == "1f1b" || name == "zb1p") {
    require_one_chunk(name, virtual_chunks);
    return with_communication(name, pp, m, looped_stages(pp, 1),
                              one_f_one_b(pp, m, name == "zb1p"));
  }
  if (name == "interleaved") {
    if (virtual_chunks < 2)
      throw Error("interleaved needs virtual chunks >= 2 per rank (got " +
                  std::to_string(virtual_chunks) + ")");
    // Megatron's condition: its micro-batch order goes round the ranks in groups of pp.
    if (m % pp != 0)
      throw Error("interleaved needs microbatches (" + std::to_string(m) +
                  ") to be a multiple of pp (" + std::to_string(pp) + ")");
    return with_communication(name, pp, m, looped_stages(pp, virtual_chunks),
                              interleaved(pp, m, virtual_chunks));
  }
  if (virtual_chunks != 2)
    throw Error("zbv runs 2 chunks per rank: virtual chunks must be 2 (got " +
                std::to_string(virtual_chunks) + ")");
  // Rank 0's warm-up alone forwards 2 pp - 1 micro-batches through its chunk 0. DualPipe-V asserts
  // 2 pp; this order also holds at 2 pp - 1 (rank 0 then has no steady round), as checked.
  if (m < 2 * pp - 1)
    throw Error("zbv needs microbatches (" + std::to_string(m) + ") >= 2 x pp - 1 (" +
                std::to_string(2 * pp - 1) + ")");
  return with_communication(name, pp, m, v_stages(pp), zbv(pp, m));
}

}  // namespace cleave
