#include "cleave/plan/step_work.h"

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "cleave/base/buffer.h"
#include "cleave/kernels/linear_fp8.h"
#include "cleave/mesh/mesh.h"
#include "cleave/model/moe.h"
#include "cleave/model/placement.h"
#include "cleave/model/tp_share.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"

namespace cleave {

double InstructionWork::flops() const {
  double f = 0;
  for (const std::vector<GemmCall>* list : {&gemms, &attention})
    for (const GemmCall& g : *list) f += 2.0 * double(g.m) * double(g.n) * double(g.k) * g.count;
  return f;
}

double block_elementwise_floats(Family family, double d_model, double hidden) {
  return family == Family::llama ? 14 * d_model + 3 * hidden : 10 * d_model + 2 * hidden;
}

std::vector<double> group_shares(const ParamStore& store, int ep) {
  std::vector<double> share;
  for (int g = 0; g < store.n_groups(); ++g)
    share.push_back(store.group_name(g) == "experts" ? 1.0 / ep : 1.0);
  return share;
}

std::vector<LinearGemm::WeightCopies> weight_copies(const Transformer& model, int64_t rows,
                                                    bool by_group,
                                                    const std::vector<double>& group_share) {
  const ParamStore& store = model.params();
  std::vector<LinearGemm::WeightCopies> copies(size_t(by_group ? store.n_groups() : model.n_units()));
  for (int i = 0; i < int(store.tensors().size()); ++i)
    if (const LinearGemm* g = store.packed_by(i)) {
      const ParamTensor& t = store.tensor(i);
      LinearGemm::WeightCopies c = g->weight_copy_bytes(rows);
      if (!group_share.empty()) {
        const double share = group_share[size_t(t.group)];
        c = {int64_t(double(c.rounded) * share), int64_t(double(c.forward) * share),
             int64_t(double(c.backward) * share)};
      }
      copies[size_t(by_group ? t.group : t.unit)] += c;
    }
  return copies;
}

namespace {

constexpr double kF = 4;  // bytes per fp32 value

using Kind = Transformer::UnitKind;

// A unit's share of the step, per micro-batch: its linears' products and attention in each pass,
// its element-wise bytes, and the collectives of its forward and backward.
struct UnitWork {
  std::vector<GemmCall> forward, backward_input, backward_weight, attention;
  // Per pass, the busiest ep rank's expert rows beyond this rank's (InstructionWork::waited).
  std::vector<GemmCall> forward_wait, backward_input_wait, backward_weight_wait;
  double forward_bytes = 0, backward_bytes = 0;
  // Its FP8 linears' own kernels beside their products (kernels::fp8_traffic), with a whole
  // backward and with a deferred weight gradient (split backward: dy not kept), and the copies
  // selective recomputation rebuilds.
  kernels::Fp8Traffic fp8, fp8_split;
  double fp8_recompute = 0;
  std::vector<CommCall> forward_comms, backward_comms;
};

class Builder {
 public:
  Builder(const ModelConfig& m, const ParallelConfig& par, const StepOptions& step,
          const Layout& layout, int pp_rank, const ExpertRouting* routing, int ep_rank)
      : m_(m), par_(par), step_(step), layout_(layout), mesh_(layout.mesh), r_(pp_rank),
        routing_(routing), ep_rank_(ep_rank) {
    tp_ = mesh_.degree(Axis::tp);
    cp_ = mesh_.degree(Axis::cp);
    R_ = mesh_.degree(Axis::dp_replicate);
    S_ = mesh_.degree(Axis::dp_shard) * cp_;
    dp_ = R_ * S_;
    for (const CarvedAxis& c : mesh_.carved()) ep_ = c.name == kEp ? c.degree : ep_;
    shard_axis_ = cp_ > 1 ? "dp_shard x cp" : "dp_shard";
    T_ = step.seq_len / cp_;
    tokens_ = double(layout.local_batch) * T_;
    rows_ = tokens_ * m.d_model;
    model_ = Transformer::planned(m, tp_, par.sequence_parallel, stage_chunks(layout, r_),
                                  step.dtype, 16 * int64_t(S_));
    // The rows the rank's experts keep (plan memory's activations and scratch): it sends its
    // choices' kept share and receives, from each of the ep ranks, its own experts' share, at the
    // largest the routing gave them (the buffers keep their largest size).
    const int E = m_.moe_experts, L = E / std::max(1, ep_);
    for (Moe* moe : model_->moe_layers())
      moe->plan_rows({peak_share(routing_, moe->layer(), E, 0, E),
                      ep_ * peak_share(routing_, moe->layer(), E, ep_rank_ * L, L)});
  }

  StepWork build() {
    StepWork out;
    out.pp_rank = r_;
    out.model = model_;
    out.program = training_program(step_, par_, layout_, r_, *model_);
    units_.resize(size_t(model_->n_units()));
    for (const Transformer::Unit& u : model_->units())
      out.unit_layer.push_back(unit_layer(u, m_.n_layers));
    out.group_share = group_shares(model_->params(), ep_);
    group_share_ = out.group_share;
    count_fp8_gathered();
    unit_copies_ = weight_copies(*model_, int64_t(tokens_), false, group_share_);
    group_copies_ = weight_copies(*model_, int64_t(tokens_), true, group_share_);
    double floats = 0;
    for (int g = 0; g < model_->params().n_groups(); ++g) floats += group_floats(g);
    huge_pages_ = floats * kF >= double(kHugePageBufferBytes);
    for (int u = 0; u < model_->n_units(); ++u) describe_unit(u);
    add_products();
    const std::vector<bool> starts =
        par_.zero_stage == 3 ? zero3_gather_starts(out.program, model_->n_units())
                             : std::vector<bool>(out.program.instructions.size(), false);
    const std::vector<bool> refills = first_weight_gradients(out.program);
    const std::vector<int64_t> packed = packed_by_passes(out.program);
    const std::vector<bool> images = fp8_weight_images(out.program, packed);
    std::map<std::tuple<Op, int, int, int, bool, bool, int64_t, bool>,
             std::shared_ptr<const InstructionWork>>
        made;
    for (size_t i = 0; i < out.program.instructions.size(); ++i) {
      const Instruction& in = out.program.instructions[i];
      auto [it, added] = made.try_emplace(
          {in.op, in.unit, in.group, in.peer, starts[i], refills[i], packed[i], images[i]});
      if (added)
        it->second = std::make_shared<const InstructionWork>(
            instruction_work(in, starts[i], refills[i], double(packed[i]), images[i]));
      out.work.push_back(it->second);
      if (is_compute(in.op) && in.op != Op::recompute) out.model_flops += it->second->flops();
    }
    return out;
  }

 private:
  // Whether the rank holds expert e: ep rank i holds the i-th 1 / ep of them.
  bool holds_expert(int e) const { return e / (m_.moe_experts / ep_) == ep_rank_; }

  // Of a MoE layer's choices, the share kept (within capacity), and the share kept for the rank's
  // own experts.
  std::pair<double, double> kept_and_own(int layer) const {
    const std::vector<double> p = expert_shares(routing_, layer, m_.moe_experts);
    double kept = 0, own = 0;
    for (int e = 0; e < m_.moe_experts; ++e) {
      kept += p[size_t(e)];
      if (holds_expert(e)) own += p[size_t(e)];
    }
    return {kept, own};
  }

  // The collective `kind` of `bytes` over the group of `axes` on the axis reported as `axis`.
  CommCall call(CommAxis metered, std::string axis, std::vector<std::string> group, Collective kind,
                double bytes, int ranks, std::string what, bool overlapped = false) const {
    return {metered, std::move(axis), std::move(group), kind, bytes, ranks, std::move(what),
            overlapped};
  }
  CommCall tp_call(Collective kind, double bytes, int ranks, std::string what) const {
    return call(CommAxis::tp, "tp", {"tp"}, kind, bytes, ranks, std::move(what));
  }

  void describe_unit(int u) {
    const Transformer::Unit& unit = model_->units()[size_t(u)];
    UnitWork& w = units_[size_t(u)];
    const double d = m_.d_model;
    const TpShare share = tp_share(m_, tp_, 0);
    if (unit.kind == Kind::embedding) {
      // The rows gathered from the table (and the positions'), written once; backward adds them
      // back.
      w.forward_bytes = w.backward_bytes = 3 * rows_ * kF;
      // The vocabulary-parallel lookup sums the ranks' rows.
      if (tp_ > 1) w.forward_comms.push_back(tp_call(Collective::all_reduce, rows_ * kF, tp_,
                                                     "the embedding's rows"));
      return;
    }
    if (unit.kind == Kind::head) {
      // The final norm, and the logits read and written by the softmax and the loss, each way.
      const double logits = tokens_ * double(share.vocab_rows);
      w.forward_bytes = w.backward_bytes = (2 * rows_ + 4 * logits) * kF;
      if (tp_ > 1) {
        w.forward_comms.push_back(tp_call(Collective::all_gather, 3 * tokens_ * kF * tp_, tp_,
                                          "the loss's 3 floats per token"));
        w.backward_comms.push_back(
            tp_call(Collective::all_reduce, rows_ * kF, tp_, "the head input's gradient"));
      }
      return;
    }
    const bool moe = m_.is_moe_layer(unit.layer);
    const double hidden = moe ? double(m_.moe_ffn_hidden) * (m_.moe_top_k + m_.moe_shared_experts)
                              : double(share.ffn);
    w.forward_bytes = block_elementwise_floats(m_.family, d, hidden) * tokens_ * kF;
    w.backward_bytes = 2 * w.forward_bytes;
    // Attention: per sequence and head, causal scores and values make one full product of the
    // rank's queries by the sequence's keys forward, two backward.
    // (Its kernel computes in fp32 whatever the products' dtype.)
    w.attention.push_back({T_, step_.seq_len, m_.head_dim(), Precision::fp32,
                           double(layout_.local_batch) * share.heads});
    if (tp_ > 1) {
      for (int i = 0; i < 2; ++i) {
        if (par_.sequence_parallel) {
          w.forward_comms.push_back(tp_call(Collective::all_gather, rows_ * kF, tp_,
                                            "a block's input rows (sequence parallel)"));
          w.forward_comms.push_back(tp_call(Collective::reduce_scatter, rows_ * kF, tp_,
                                            "a block's output rows (sequence parallel)"));
          w.backward_comms.push_back(tp_call(Collective::all_gather, rows_ * kF, tp_,
                                             "a block's input rows again (sequence parallel)"));
          w.backward_comms.push_back(tp_call(Collective::all_gather, rows_ * kF, tp_,
                                             "a block's output gradient (sequence parallel)"));
          w.backward_comms.push_back(tp_call(Collective::reduce_scatter, rows_ * kF, tp_,
                                             "a block's input gradient (sequence parallel)"));
        } else {
          w.forward_comms.push_back(
              tp_call(Collective::all_reduce, rows_ * kF, tp_, "a block's activations"));
          w.backward_comms.push_back(
              tp_call(Collective::all_reduce, rows_ * kF, tp_, "a block's activation gradients"));
        }
      }
    }
    if (cp_ > 1) context_comms(w, share);
    if (moe && ep_ > 1) {
      // Of its tokens x k choices the rank sends those kept for the other ranks' experts, and
      // sends back to the other ep - 1 ranks their rows for its own experts. An all-to-all of n
      // bytes sends (ep - 1) / ep n to the others (axis_volume.h): n is set so it sends these.
      const auto [kept, own] = kept_and_own(unit.layer);
      const double choices = tokens_ * m_.moe_top_k * d * kF, to_n = double(ep_) / (ep_ - 1);
      const double rows = routing_ ? choices * (kept - own) * to_n : choices;
      const double back = routing_ ? choices * (ep_ - 1) * own * to_n : choices;
      const double counts = double(ep_) * (m_.moe_experts / ep_) * kF;
      auto ep_call = [&](double bytes, const char* what) {
        return call(CommAxis::ep, "ep", {kEp}, Collective::all_to_all, bytes, ep_, what);
      };
      w.forward_comms.push_back(ep_call(counts, "the routed rows' counts per expert"));
      w.forward_comms.push_back(ep_call(rows, "token rows to their experts' ranks"));
      w.forward_comms.push_back(ep_call(back, "the experts' outputs back"));
      w.backward_comms.push_back(ep_call(rows, "the outputs' gradients to the experts' ranks"));
      w.backward_comms.push_back(ep_call(back, "the rows' gradients back"));
    }
  }

  // Attention's exchanges over cp (model/context_attention.cpp), per layer and micro-batch: a
  // ring of R ranks sends its K|V rows on R - 1 steps forward and again backward, and their
  // gradients on R steps; the all-gather mode gathers them in forward and again in backward and
  // reduce-scatters their gradients; Ulysses' all-to-alls move q|k|v and the output to the heads
  // and back, and in backward the output and its gradient to the heads, the q|k|v gradients back.
  void context_comms(UnitWork& w, const TpShare& share) const {
    const int U = layout_.cp_ulysses, R = cp_ / U;
    const double hd = m_.head_dim();
    const double heads_u = share.heads / U;
    const double kv_heads_u = share.kv_heads % U == 0 ? share.kv_heads / U : 1;
    const double kv = U * tokens_ * 2 * kv_heads_u * hd * kF;  // one ring position's K|V
    auto cp_call = [&](Collective kind, double bytes, int ranks, const char* what) {
      return call(CommAxis::cp, "cp", {"cp"}, kind, bytes, ranks, what);
    };
    if (layout_.cp_mode == CpMode::allgather) {
      w.forward_comms.push_back(cp_call(Collective::all_gather, R * kv, R, "K|V gathered"));
      w.backward_comms.push_back(
          cp_call(Collective::all_gather, R * kv, R, "K|V gathered again"));
      w.backward_comms.push_back(
          cp_call(Collective::reduce_scatter, R * kv, R, "the K|V gradients"));
    } else if (R > 1) {
      auto ring = [&](int steps, const char* what) {
        CommCall c = cp_call(Collective::send_recv, kv, 2, what);
        c.repeats = steps;
        return c;
      };
      w.forward_comms.push_back(ring(R - 1, "K|V around the ring"));
      w.backward_comms.push_back(ring(R - 1, "K|V around the ring again"));
      w.backward_comms.push_back(ring(R, "the K|V gradients around the ring"));
    }
    if (U > 1) {
      const double qkv = tokens_ * (heads_u + 2 * kv_heads_u) * hd * kF;
      const double o = tokens_ * heads_u * hd * kF;
      w.forward_comms.push_back(cp_call(Collective::all_to_all, U * qkv, U, "q|k|v to the heads"));
      w.forward_comms.push_back(cp_call(Collective::all_to_all, U * o, U, "the output back"));
      w.backward_comms.push_back(
          cp_call(Collective::all_to_all, U * o, U, "the output to the heads again"));
      w.backward_comms.push_back(
          cp_call(Collective::all_to_all, U * o, U, "the output's gradient to the heads"));
      w.backward_comms.push_back(
          cp_call(Collective::all_to_all, U * qkv, U, "the q|k|v gradients back"));
    }
  }

  // Each linear's three products, in the unit that runs them: a tied embedding's table in the
  // head that uses it. A routed expert takes its share of the layer's choices from each of the
  // ep ranks: the rank holds its 1 / ep of the experts (the planned model has them all, in order,
  // each with as many linears).
  void add_products() {
    const ParamStore& store = model_->params();
    const std::vector<Transformer::Unit>& units = model_->units();
    const double N = tokens_;
    std::vector<int> expert_linears(units.size(), 0), seen(units.size(), 0);
    for (int i = 0; i < int(store.tensors().size()); ++i)
      if (store.packed_by(i) && store.group_name(store.tensor(i).group) == "experts")
        ++expert_linears[size_t(store.tensor(i).unit)];
    for (int i = 0; i < int(store.tensors().size()); ++i) {
      const LinearGemm* g = store.packed_by(i);
      if (!g) continue;
      int u = store.tensor(i).unit;
      if (units[size_t(u)].kind == Kind::embedding)
        for (int h = 0; h < int(units.size()); ++h)
          if (units[size_t(h)].kind == Kind::head &&
              std::count(units[size_t(h)].uses.begin(), units[size_t(h)].uses.end(), u))
            u = h;
      if (units[size_t(u)].kind == Kind::embedding) continue;
      double rows = N, waited = 0;
      if (store.group_name(store.tensor(i).group) == "experts") {
        const int b = store.tensor(i).unit, layer = units[size_t(b)].layer;
        const int e = seen[size_t(b)]++ * m_.moe_experts / expert_linears[size_t(b)];
        if (!holds_expert(e)) continue;
        const std::vector<double> shares = expert_shares(routing_, layer, m_.moe_experts);
        rows = N * m_.moe_top_k * ep_ * shares[size_t(e)];
        // The busiest rank's rows beyond the rank's own, in proportion to each of its experts.
        const double own = kept_and_own(layer).second;
        const double busiest = busiest_rank_share(routing_, layer, m_.moe_experts, ep_);
        if (ep_ > 1 && own > 0 && busiest > own) waited = rows * (busiest / own - 1);
      }
      const int64_t M = std::max<int64_t>(1, int64_t(rows + 0.5));
      const int64_t in = g->in_features(), out = g->out_features();
      const Precision p = g->precision();
      UnitWork& w = units_[size_t(u)];
      w.forward.push_back({M, out, in, p, 1});
      w.backward_input.push_back({M, in, out, p, 1});
      w.backward_weight.push_back({out, in, M, p, 1});
      if (waited >= 0.5) {
        const int64_t W = int64_t(waited + 0.5);
        w.forward_wait.push_back({W, out, in, p, 1});
        w.backward_input_wait.push_back({W, in, out, p, 1});
        w.backward_weight_wait.push_back({out, in, W, p, 1});
      }
      if (p == Precision::fp8) add_fp8_traffic(w, i, M);
    }
  }

  // Linear i's FP8 kernels on M rows, as the block runs it (model/block.cpp, mlp.cpp,
  // self_attention.cpp): under sequence parallelism the column-parallel entries (qkv, fc) keep no
  // codes of their gathered input, and the row-parallel exits (out, proj) add their bias after
  // the sum; selective recomputation rebuilds the kept codes of qkv's, fc's and proj's inputs.
  void add_fp8_traffic(UnitWork& w, int i, int64_t M) const {
    const ParamStore& store = model_->params();
    const std::string& name = store.tensor(i).name;
    const bool split = tp_ > 1 && par_.sequence_parallel;
    const bool entry = name.ends_with(".attn.qkv.weight") || name.ends_with(".mlp.fc.weight");
    const bool exit = name.ends_with(".attn.out.weight") || name.ends_with(".mlp.proj.weight");
    kernels::Fp8LinearUse use;
    use.bias = m_.family == Family::gpt2 && !(tp_ > 1 && exit);
    use.x_kept = !(split && entry);
    use.gathered_fp8 = par_.fp8_allgather && par_.zero_stage == 3;
    const LinearGemm& g = *store.packed_by(i);
    use.images = g.fp8_images(M);
    const int64_t in = g.in_features(), out = g.out_features();
    const kernels::Fp8Traffic whole = kernels::fp8_traffic(step_.fp8.recipe, M, in, out, use);
    use.dy_kept = false;  // a deferred weight gradient's
    w.fp8_split += kernels::fp8_traffic(step_.fp8.recipe, M, in, out, use);
    w.fp8 += whole;
    if (use.x_kept && (entry || name.ends_with(".mlp.proj.weight")))
      w.fp8_recompute += whole.x_copy;
  }

  // The data-parallel family's collectives: per unit its gradients' reduction, ZeRO-3's gathers
  // of its parameters, ZeRO-1/2's gathers of a group's updated shards.
  double dense_floats(int u) const {
    const ParamStore& store = model_->params();
    double n = 0;
    for (int g = 0; g < store.n_groups(); ++g)
      if (g == 0 || ep_ == 1) n += double(store.unit_bounds(g)[size_t(u) + 1] - store.unit_bounds(g)[size_t(u)]);
    return n;
  }
  // The experts' floats of unit u on this rank (their share of the rank's 1 / ep of them).
  double expert_floats(int u) const {
    const ParamStore& store = model_->params();
    if (ep_ == 1 || store.n_groups() < 2) return 0;
    const std::vector<int64_t>& b = store.unit_bounds(1);
    const double region = double(b.back() - b.front());
    return region > 0 ? double(store.global_count(1)) / ep_ *
                            double(b[size_t(u) + 1] - b[size_t(u)]) / region
                      : 0;
  }

  void reduce_comms(int u, std::vector<CommCall>& out) const {
    const double P = dense_floats(u) * kF;
    const int zero = par_.zero_stage;
    if (zero <= 1) {
      out.push_back(call(CommAxis::dp, "dp", {"dp_replicate", "dp_shard", "cp"},
                         Collective::all_reduce, P, dp_, "a unit's gradients", true));
    } else {
      out.push_back(call(CommAxis::dp, shard_axis_, {"dp_shard", "cp"}, Collective::reduce_scatter,
                         P, S_, "a unit's gradients", true));
      if (R_ > 1)
        out.push_back(call(CommAxis::dp, "dp_replicate", {"dp_replicate"}, Collective::all_reduce,
                           P / S_, R_, "a unit's gradient shard", true));
    }
    const double E = expert_floats(u) * kF;
    if (E == 0) return;
    const int efsdp = S_ / ep_;
    if (zero <= 1) {
      out.push_back(call(CommAxis::dp, "efsdp", {"dp_replicate", kEfsdp}, Collective::all_reduce,
                         E, R_ * efsdp, "a unit's experts' gradients", true));
    } else {
      out.push_back(call(CommAxis::dp, "efsdp", {kEfsdp}, Collective::reduce_scatter, E, efsdp,
                         "a unit's experts' gradients", true));
      if (R_ > 1)
        out.push_back(call(CommAxis::dp, "efsdp", {"dp_replicate"}, Collective::all_reduce,
                           E / efsdp, R_, "a unit's experts' gradient shard", true));
    }
  }

  // With parallel.fp8_allgather, per group and unit, the FP8 linears' weights that ZeRO-3 gathers
  // at one byte per value (parallel/fp8_allgather.h).
  void count_fp8_gathered() {
    const ParamStore& store = model_->params();
    fp8_gathered_.assign(size_t(store.n_groups()), std::vector<double>(units_.size(), 0.0));
    if (!par_.fp8_allgather) return;
    for (int i = 0; i < int(store.tensors().size()); ++i)
      if (store.fp8_weight(i)) {
        const ParamTensor& w = store.tensor(i);
        fp8_gathered_[size_t(w.group)][size_t(w.unit)] += double(w.numel);
      }
  }

  // ZeRO-3's gather of unit u's parameters: each group's region, its FP8 weights at one byte per
  // value as counted above.
  void gather_comms(int u, bool overlapped, std::vector<CommCall>& out) const {
    const ParamStore& store = model_->params();
    for (int g = 0; g < store.n_groups(); ++g) {
      const double share = group_share(g);
      const bool experts = share < 1;
      const double n =
          double(store.unit_bounds(g)[size_t(u) + 1] - store.unit_bounds(g)[size_t(u)]) * share;
      const double f = fp8_gathered_[size_t(g)][size_t(u)] * share;
      const double bytes = (n - f) * kF + f;
      if (experts)
        out.push_back(call(CommAxis::dp, "efsdp", {kEfsdp}, Collective::all_gather, bytes,
                           S_ / ep_, "a unit's experts' parameters", overlapped));
      else
        out.push_back(call(CommAxis::dp, shard_axis_, {"dp_shard", "cp"}, Collective::all_gather,
                           bytes, S_, "a unit's parameters", overlapped));
    }
  }

  // ZeRO-1/2's gather of group g's updated shards.
  void gather_params_comms(int g, std::vector<CommCall>& out) const {
    const ParamStore& store = model_->params();
    if (par_.zero_stage == 0 || par_.zero_stage == 3) return;
    if (store.group_name(g) == "experts" && ep_ > 1) {
      out.push_back(call(CommAxis::dp, "efsdp", {kEfsdp}, Collective::all_gather,
                         double(store.global_count(g)) / ep_ * kF, S_ / ep_,
                         "the experts' updated shards"));
      return;
    }
    const std::vector<int64_t>& b = store.unit_bounds(g);
    out.push_back(call(CommAxis::dp, shard_axis_, {"dp_shard", "cp"}, Collective::all_gather,
                       double(b.back() - b.front()) * kF, S_, "a group's updated shards"));
  }

  // The gradients summed over tp once per step: sequence parallelism's norms (replicated over
  // tp, each rank's rows' part) and the kv heads replicated when tp > n_kv_heads.
  void tp_step_comms(std::vector<CommCall>& out) const {
    const ParamStore& store = model_->params();
    double partial = 0, kv = 0;
    for (const ParamTensor& p : store.tensors()) {
      if (p.placement.shard_dim < 0 && p.placement.pending == kTpAxis) partial += double(p.numel);
      for (const Segment& s : p.placement.segments)
        if (s.pending == kKvReplicasAxis) kv += double(s.length * (p.numel / p.shape[0]));
    }
    const int kv_replicas = tp_ > m_.n_kv_heads ? tp_ / m_.n_kv_heads : 1;
    if (partial > 0)
      out.push_back(tp_call(Collective::all_reduce, partial * kF, tp_, "the norms' gradients"));
    if (kv > 0 && kv_replicas > 1)
      out.push_back(tp_call(Collective::all_reduce, kv * kF, kv_replicas,
                            "the replicated kv heads' gradients"));
  }

  double group_share(int g) const { return group_share_[size_t(g)]; }
  // Group g's parameters on this rank.
  double group_floats(int g) const {
    const std::vector<int64_t>& b = model_->params().unit_bounds(g);
    return double(b.back() - b.front()) * group_share(g);
  }
  // The trainer keys its releases and packing on the stage alone (parallel/data_parallel.cpp),
  // one shard rank or many.
  bool sharded_update() const { return par_.zero_stage > 0; }
  // A group's update: AdamW reads the values, gradients and two moments of the parameters it
  // updates and writes the values and moments; below ZeRO-2 the whole gradient buffer is zeroed
  // for the next step (ZeRO-2 and 3 free it instead).
  double update_bytes(int g) const {
    const double n = group_floats(g);
    return (7 * (sharded_update() ? n / S_ : n) + (par_.zero_stage < 2 ? n : 0)) * kF;
  }
  // The gradient norm reads every gradient the rank holds: the whole buffer below ZeRO-2, its
  // shard from ZeRO-2 on.
  double norm_bytes() const {
    double n = 0;
    for (int g = 0; g < model_->params().n_groups(); ++g)
      n += par_.zero_stage >= 2 ? group_floats(g) / S_ : group_floats(g);
    return n * kF;
  }
  // Where the products' weight copies are packed anew: by the update itself where the rank
  // updates whole weights (it packs each band as it writes it); after ZeRO-1/2's gather of the
  // updated shards (by the next products, costed at the gather); under ZeRO-3 by a unit's first
  // forward and first backward after each gather (packed_by_passes).
  double packed_at_update(int g) const {
    return sharded_update() ? 0 : double(group_copies_[size_t(g)].total());
  }
  double packed_at_gather(int g) const {
    return sharded_update() && par_.zero_stage < 3
               ? double(group_copies_[size_t(g)].total())
               : 0;
  }
  // ZeRO-3 packs a unit's copies at its first product pass after each gather (zero3_peak's walk
  // of the program): per instruction, the bytes it packs.
  std::vector<int64_t> packed_by_passes(const Program& program) const {
    if (par_.zero_stage != 3) return std::vector<int64_t>(program.instructions.size(), 0);
    std::vector<int64_t> floats;
    for (int u = 0; u < model_->n_units(); ++u) floats.push_back(int64_t(unit_floats(u)));
    return zero3_peak(program, floats, unit_copies_).packed;
  }

  // ZeRO-2/3 return each unit's gradients to the system once the step has reduced them: the
  // instruction that first writes a unit's gradients in the next step faults them in again. That
  // is its first backward or backward_weight; a unit whose weight part does no work (the
  // embedding, the head) under a split backward writes them in backward_input.
  std::vector<bool> first_weight_gradients(const Program& program) const {
    std::vector<bool> first(program.instructions.size(), false);
    if (par_.zero_stage < 2) return first;
    const size_t none = program.instructions.size();
    std::vector<size_t> weights(size_t(model_->n_units()), none), inputs = weights;
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& in = program.instructions[i];
      std::vector<size_t>& at = in.op == Op::backward_input ? inputs : weights;
      if ((in.op == Op::backward || in.op == Op::backward_weight || in.op == Op::backward_input) &&
          at[size_t(in.unit)] == none)
        at[size_t(in.unit)] = i;
    }
    for (size_t u = 0; u < weights.size(); ++u) {
      const size_t i = weights[u] != none ? weights[u] : inputs[u];
      if (i != none) first[i] = true;
    }
    return first;
  }
  // Unit u's floats in the rank's flat buffers (values and gradients alike), over its groups.
  double unit_floats(int u) const {
    const ParamStore& store = model_->params();
    double n = 0;
    for (int g = 0; g < store.n_groups(); ++g)
      n += double(store.unit_bounds(g)[size_t(u) + 1] - store.unit_bounds(g)[size_t(u)]) *
           group_share(g);
    return n;
  }

  // FP8 products make their weights' images once per weight version, at the first product after
  // it changes: a unit's first forward of the step, or under ZeRO-3 each pass that packs its
  // copies after a gather (packed_by_passes). Per instruction, whether it makes its unit's.
  std::vector<bool> fp8_weight_images(const Program& program,
                                      const std::vector<int64_t>& packed) const {
    std::vector<bool> images(program.instructions.size(), false);
    if (step_.dtype != Precision::fp8) return images;
    std::vector<bool> seen(size_t(model_->n_units()), false);
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& in = program.instructions[i];
      if (par_.zero_stage == 3) {
        images[i] = packed[i] > 0 && is_compute(in.op);
      } else if (in.op == Op::forward && !seen[size_t(in.unit)]) {
        images[i] = seen[size_t(in.unit)] = true;
      }
    }
    return images;
  }

  InstructionWork instruction_work(const Instruction& in, bool starts_gather, bool refills_gradients,
                                   double packed_by_pass, bool fp8_image) const {
    InstructionWork w;
    w.refault_huge = huge_pages_;
    if (refills_gradients) w.refault_bytes = unit_floats(in.unit) * kF;
    if (starts_gather && par_.zero_stage == 3) w.refault_bytes = unit_floats(in.unit) * kF;
    const bool full = step_.activation_checkpointing == "full";
    auto add = [](std::vector<GemmCall>& to, const std::vector<GemmCall>& from) {
      to.insert(to.end(), from.begin(), from.end());
    };
    auto comms = [&](const std::vector<CommCall>& from) {
      w.comms.insert(w.comms.end(), from.begin(), from.end());
    };
    const UnitWork* u = in.unit >= 0 ? &units_[size_t(in.unit)] : nullptr;
    // ZeRO-3 packs each pass's own copy after a gather; otherwise the next product packs all.
    if (fp8_image) w.fp8_bytes += par_.zero_stage == 3 ? u->fp8.weight_image_one : u->fp8.weight_images;
    switch (in.op) {
      case Op::forward:
        add(w.gemms, u->forward);
        add(w.waited, u->forward_wait);
        add(w.attention, u->attention);
        w.elementwise_bytes += u->forward_bytes;
        w.fp8_bytes += u->fp8.forward;
        w.pack_bytes = packed_by_pass;
        comms(u->forward_comms);
        break;
      case Op::recompute:
        // Full checkpointing runs the block's forward again; selective rebuilds only what needs
        // no product (norms, activations) and the FP8 codes its products keep.
        w.elementwise_bytes += u->forward_bytes;
        w.fp8_bytes += full ? 0 : u->fp8_recompute;
        if (full) {
          add(w.gemms, u->forward);
          add(w.waited, u->forward_wait);
          add(w.attention, u->attention);
          w.fp8_bytes += u->fp8.forward;
          w.pack_bytes = packed_by_pass;
          comms(u->forward_comms);
        }
        break;
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight: {
        const bool input = in.op != Op::backward_weight, weight = in.op != Op::backward_input;
        // A split backward defers the weight gradient, which then quantises dy again.
        const kernels::Fp8Traffic& fp8 = in.op == Op::backward ? u->fp8 : u->fp8_split;
        if (input) {
          add(w.gemms, u->backward_input);
          add(w.waited, u->backward_input_wait);
          for (GemmCall a : u->attention) {
            a.count *= 2;
            w.attention.push_back(a);
          }
          w.elementwise_bytes += u->backward_bytes;
          w.fp8_bytes += fp8.backward_input;
          w.pack_bytes = packed_by_pass;
          comms(u->backward_comms);
        }
        if (weight) {
          add(w.gemms, u->backward_weight);
          add(w.waited, u->backward_weight_wait);
          w.fp8_bytes += fp8.backward_weight;
        }
        break;
      }
      case Op::send_forward:
      case Op::send_backward:
        w.comms.push_back(call(CommAxis::pp, "pp", {"pp"}, Collective::send_recv,
                               rows_ / (par_.sequence_parallel ? tp_ : 1) * kF, 2,
                               in.op == Op::send_forward ? "a stage's output activations"
                                                         : "a stage's input gradient",
                               true));
        w.comms.back().peer = in.peer;
        break;
      case Op::tied_sum: {
        const int tied = model_->pipeline_tied_tensor();
        if (tied >= 0)
          w.comms.push_back(call(CommAxis::pp, "pp", {"pp"}, Collective::all_reduce,
                                 double(model_->params().tensor(tied).numel) * kF, 2,
                                 "the tied embedding's gradient"));
        break;
      }
      case Op::gather:
      case Op::prefetch:
        if (starts_gather && dp_ > 1) gather_comms(in.unit, in.op == Op::prefetch, w.comms);
        break;
      case Op::reduce_grads:
        if (dp_ > 1) reduce_comms(in.unit, w.comms);
        break;
      case Op::finish_grads:
        if (tp_ > 1) tp_step_comms(w.comms);
        break;
      case Op::gather_params:
        if (dp_ > 1) gather_params_comms(in.group, w.comms);
        w.pack_bytes = packed_at_gather(in.group);
        break;
      case Op::grad_norm:
        w.stream_bytes = norm_bytes();
        break;
      case Op::update:
        w.stream_bytes = update_bytes(in.group);
        w.pack_bytes = packed_at_update(in.group);
        break;
      default:
        break;
    }
    // A group of one rank (efsdp = 1, a lone replica) moves nothing.
    std::erase_if(w.comms, [](const CommCall& c) { return c.ranks < 2; });
    return w;
  }

  const ModelConfig& m_;
  const ParallelConfig& par_;
  const StepOptions& step_;
  const Layout& layout_;
  const Mesh& mesh_;
  int r_;
  const ExpertRouting* routing_;
  int ep_rank_;
  int tp_ = 1, cp_ = 1, R_ = 1, S_ = 1, dp_ = 1, ep_ = 1, T_ = 0;
  std::string shard_axis_;
  double tokens_ = 0, rows_ = 0;
  std::shared_ptr<Transformer> model_;
  std::vector<UnitWork> units_;
  std::vector<std::vector<double>> fp8_gathered_;  // per group and unit
  std::vector<double> group_share_;  // StepWork::group_share
  // packed per step (above), at the rank's group_share_
  std::vector<LinearGemm::WeightCopies> unit_copies_, group_copies_;
  bool huge_pages_ = false;  // the rank's flat buffers have huge pages (Buffer::resize)
};

}  // namespace

StepWork step_work(const ModelConfig& model, const ParallelConfig& parallel,
                   const StepOptions& step, const Layout& layout, int pp_rank,
                   const ExpertRouting* routing, int ep_rank) {
  return Builder(model, parallel, step, layout, pp_rank, routing, ep_rank).build();
}

}  // namespace cleave
