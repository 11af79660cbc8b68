#include "cleave/plan/step_time.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

#include "cleave/base/check.h"
#include "cleave/mesh/mesh.h"
#include "cleave/model/transformer.h"

namespace cleave {

namespace {

double sum(const std::vector<std::pair<std::string, double>>& parts) {
  double s = 0;
  for (const auto& p : parts) s += p.second;
  return s;
}

}  // namespace

std::vector<RankTime> simulate_programs(
    const std::vector<Program>& programs,
    const std::function<InstructionCost(int rank, size_t i)>& cost) {
  const int P = int(programs.size());
  // A message between stages: forward or backward, from, to, tag.
  using Message = std::tuple<bool, int, int, int>;
  std::map<Message, double> arrival;
  struct Done {
    double at = 0;
    std::string axis;
  };
  struct State {
    size_t next = 0;
    double now = 0;
    Done stream;                  // the communication stream: free from `at`, last posted `axis`
    std::map<int, Done> fetched;  // ZeRO-3: a unit's prefetch, done at
    // Receives posted and not yet waited for: by forward or backward, chunk and slot.
    std::map<std::tuple<bool, int, int>, Message> posted;
    const Instruction* last_compute = nullptr;
    bool done = false;
  };
  std::vector<State> state(programs.size());
  std::vector<RankTime> out(programs.size());
  // Waits until `until` on rank r's clock, the wait counted on `axis`.
  auto wait = [&](int r, double until, const std::string& axis) {
    State& s = state[size_t(r)];
    if (until > s.now) {
      out[size_t(r)].comm[axis] += until - s.now;
      s.now = until;
    }
  };
  for (int finished = 0; finished < P;) {
    bool moved = false;
    for (int r = 0; r < P; ++r) {
      State& s = state[size_t(r)];
      RankTime& rt = out[size_t(r)];
      const std::vector<Instruction>& list = programs[size_t(r)].instructions;
      while (s.next < list.size()) {
        const Instruction& in = list[s.next];
        // A receive is posted; the compute that reads its slot waits for the message.
        if (in.op == Op::recv_forward || in.op == Op::recv_backward) {
          s.posted[{in.op == Op::recv_forward, in.chunk, in.slot}] = {in.op == Op::recv_forward,
                                                                      in.peer, r, in.tag};
          ++s.next;
          moved = true;
          continue;
        }
        if (is_compute(in.op)) {
          const bool forward = in.op == Op::forward || in.op == Op::recompute;
          auto p = s.posted.find({forward, in.chunk, in.slot});
          if (p != s.posted.end()) {
            auto it = arrival.find(p->second);
            if (it == arrival.end()) break;  // its send has not run yet
            if (it->second > s.now) {
              rt.pipeline_wait += it->second - s.now;
              s.now = it->second;
            }
            s.posted.erase(p);
          }
        }
        const InstructionCost c = cost(r, s.next);
        if (in.op == Op::gather && c.blocking.empty()) {
          auto f = s.fetched.find(in.unit);
          if (f != s.fetched.end()) wait(r, f->second.at, f->second.axis);
        }
        if (in.op == Op::finish_grads) wait(r, s.stream.at, s.stream.axis);
        const double start = s.now;
        s.now += c.compute;
        rt.gemm += c.compute;
        for (const auto& [axis, seconds] : c.blocking) {
          s.now += seconds;
          rt.comm[axis] += seconds;
        }
        if (is_compute(in.op)) {
          // The action's units, and what ran between them (ZeRO-3's gathers), as the trainer's
          // trace spans them.
          if (s.last_compute && same_action(in, *s.last_compute))
            rt.spans.back().end = s.now;
          else
            rt.spans.push_back({action_name(in), start, s.now});
          s.last_compute = &in;
        }
        if (in.op == Op::send_forward || in.op == Op::send_backward) {
          arrival[{in.op == Op::send_forward, r, in.peer, in.tag}] = s.now + sum(c.overlapped);
        } else if (!c.overlapped.empty()) {
          s.stream.at = std::max(s.stream.at, s.now) + sum(c.overlapped);
          s.stream.axis = c.overlapped.back().first;
          if (in.op == Op::prefetch) s.fetched[in.unit] = s.stream;
        }
        ++s.next;
        moved = true;
      }
      if (!s.done && s.next == list.size()) {
        wait(r, s.stream.at, s.stream.axis);  // the step ends when its reductions have
        rt.end = s.now;
        s.done = true;
        ++finished;
        moved = true;
      }
    }
    if (!moved && finished < P) {
      for (int r = 0; r < P; ++r) {
        const State& s = state[size_t(r)];
        if (s.next < programs[size_t(r)].instructions.size())
          throw Error("step simulation: pp rank " + std::to_string(r) + " waits forever at " +
                      to_string(programs[size_t(r)].instructions[s.next]) +
                      " (instruction " + std::to_string(s.next) + ")");
      }
    }
  }
  return out;
}

CostedWork cost_work(const StepWork& work, const Layout& layout, const Cluster& cluster) {
  const Mesh& mesh = layout.mesh;
  // pp rank r stands for the world rank at its pipeline coordinate, every other one 0.
  auto world_rank = [&](int r) {
    std::array<int, kAxes> coords{};
    coords[size_t(Axis::pp)] = r;
    return mesh.rank_of(coords);
  };
  auto host = [&](int rank) { return rank / std::max(1, cluster.devices_per_host); };
  const int me = world_rank(work.pp_rank);
  std::map<std::vector<std::string>, bool> group_inside;  // a step names few groups, many times
  auto link = [&](const CommCall& c) {
    bool inside = true;
    if (c.peer >= 0) {
      inside = host(world_rank(c.peer)) == host(me);
    } else {
      auto [it, added] = group_inside.try_emplace(c.group, true);
      if (added)
        for (int other : mesh.group(me, c.group)) it->second = it->second && host(other) == host(me);
      inside = it->second;
    }
    return inside ? LinkClass::intra_host : LinkClass::inter_host;
  };
  auto products = [&](const std::vector<GemmCall>& calls) {
    double s = 0;
    for (const GemmCall& g : calls)
      s += gemm_seconds(cluster, g.m, g.n, g.k, product_dtype(g.dtype)) * g.count;
    return s;
  };
  const double imbalance = compute_imbalance_on(cluster, mesh.world());
  struct Costed {
    InstructionCost cost;
    double gemm = 0, attention = 0, elementwise = 0, imbalance = 0;
  };
  auto cost_instruction = [&](const InstructionWork& iw) {
    Costed k;
    InstructionCost& c = k.cost;
    k.gemm = products(iw.gemms);
    for (const GemmCall& a : iw.attention) k.attention += attention_seconds(cluster, a.m, a.n, a.k) * a.count;
    k.elementwise = elementwise_seconds(cluster, iw.elementwise_bytes) + fp8_seconds(cluster, iw.fp8_bytes) +
                    memory_seconds(cluster, iw.stream_bytes) + pack_seconds(cluster, iw.pack_bytes) +
                    refault_seconds(cluster, iw.refault_bytes, iw.refault_huge);
    const double alone = k.gemm + k.attention + k.elementwise;
    // The wait for the slowest rank: its pace, and under ep the busiest rank's extra expert rows.
    k.imbalance = alone * (imbalance - 1) + products(iw.waited) * imbalance;
    c.compute = alone + k.imbalance;
    for (const CommCall& call : iw.comms) {
      const LinkClass l = link(call);
      const double s =
          call.repeats * collective_seconds(cluster, call.kind, l, call.bytes, call.ranks);
      if (!call.overlapped) {
        c.blocking.push_back({call.axis, s});
        continue;
      }
      // It runs beside compute, and slows it (where the rank's own cores move the bytes).
      const double slowdown = cluster.compute_slowdown[size_t(l)];
      if (slowdown > 0) c.blocking.push_back({call.axis, slowdown * s});
      c.overlapped.push_back({call.axis, s});
    }
    return k;
  };
  CostedWork out;
  out.costs.reserve(work.work.size());
  // Instructions that share their work (a unit's forward on every micro-batch) cost the same.
  std::map<const InstructionWork*, Costed> costed;
  for (const auto& shared : work.work) {
    auto [it, added] = costed.try_emplace(shared.get());
    Costed& k = it->second;
    if (added) k = cost_instruction(*shared);
    out.gemm += k.gemm;
    out.attention += k.attention;
    out.elementwise += k.elementwise;
    out.imbalance += k.imbalance;
    out.costs.push_back(k.cost);
  }
  return out;
}

StepPrediction predict_step(const std::vector<StepWork>& work, const Layout& layout,
                            const Cluster& cluster, const ModelConfig& model,
                            const StepOptions& step) {
  const double global_tokens = double(step.micro_batch_size) * step.seq_len * step.grad_accum_steps;
  const int pp = layout.mesh.degree(Axis::pp);
  CLEAVE_CHECK(int(work.size()) == pp, "predict_step: " + std::to_string(work.size()) +
                                           " ranks' work for pp = " + std::to_string(pp));
  StepPrediction out;
  out.model_flops = global_tokens * model_flops_per_token(model, step.seq_len);
  std::vector<Program> programs;
  std::vector<CostedWork> costed;
  for (const StepWork& w : work) {
    programs.push_back(w.program);
    costed.push_back(cost_work(w, layout, cluster));
  }
  out.ranks = simulate_programs(
      programs, [&](int r, size_t i) { return costed[size_t(r)].costs[i]; });
  for (int r = 0; r < pp; ++r) {
    RankTime& t = out.ranks[size_t(r)];
    t.gemm = costed[size_t(r)].gemm;
    t.attention = costed[size_t(r)].attention;
    t.elementwise = costed[size_t(r)].elementwise;
    t.imbalance = costed[size_t(r)].imbalance;
    out.step_seconds = std::max(out.step_seconds, t.end);
  }
  out.tokens_per_second = global_tokens / out.step_seconds;
  auto peak = cluster.peak_gflops.find(product_dtype(step.dtype));
  if (peak != cluster.peak_gflops.end()) {
    out.peak_gflops = peak->second;
    out.mfu = out.model_flops / out.step_seconds /
              (double(layout.mesh.world()) * peak->second * 1e9);
  }
  return out;
}

}  // namespace cleave
