#include "cleave/train/comm_volume.h"

#include <cmath>

#include "cleave/model/tp_share.h"
#include "cleave/model/transformer.h"
#include "cleave/parallel/data_parallel.h"

namespace cleave {

namespace {

double ring_all_reduce(double n, int p) { return p > 1 ? 2.0 * (p - 1) / p * n * 4 : 0; }
double ring_gather(double n, int p) { return p > 1 ? double(p - 1) / p * n * 4 : 0; }

// Attention's exchanges per step (model/context_attention.cpp), per layer and micro-batch: a
// ring of R ranks sends its K|V rows on R - 1 steps forward and again backward, and their
// gradients on R steps; the all-gather gathers them in forward and again in backward (no layer keeps every
// rank's) and reduce-scatters their gradients; Ulysses'
// all-to-alls move q|k|v, and in backward the output (kept in the rank's rows only) and its
// gradient, one way, the output and the q|k|v gradients back.
// A recomputed layer's forward exchanges again: K|V around the ring or gathered, or Ulysses'
// q|k|v there and output back.
AxisVolume context_volume(const Config& cfg, const Layout& layout, double tokens, double layers,
                          double recomputed) {
  const ModelConfig& m = cfg.model;
  const int cp = layout.mesh.degree(Axis::cp), U = layout.cp_ulysses, R = cp / U;
  const TpShare share = tp_share(m, layout.mesh.degree(Axis::tp), 0);
  const double hd = m.head_dim();
  const double heads_u = share.heads / U;
  const double kv_heads_u = share.kv_heads % U == 0 ? share.kv_heads / U : 1;
  // K|V rows of one ring position: its Ulysses group's tokens.
  const double kv = U * tokens * 2 * kv_heads_u * hd * 4;
  double per_layer = 0, forward = 0;  // per layer: all, and the forward's part
  std::string how;
  if (layout.cp_mode == CpMode::allgather) {
    per_layer = 3 * (R - 1) * kv;
    forward = (R - 1) * kv;
    how = "K|V all-gathered in forward and again in backward, their gradients reduce-scattered, "
          "per layer and micro-batch";
  } else if (R > 1) {
    per_layer = (3.0 * R - 2) * kv;
    forward = (R - 1) * kv;
    how = "K|V around a ring of " + std::to_string(R) + " on " + std::to_string(R - 1) +
          " steps forward and backward, their gradients on " + std::to_string(R) + " steps";
  }
  if (U > 1) {
    const double qkv = tokens * (heads_u + 2 * kv_heads_u) * hd * 4, o = tokens * heads_u * hd * 4;
    per_layer += 2 * (U - 1) * (qkv + o) + (U - 1) * o;
    forward += (U - 1) * (qkv + o);
    how += std::string(how.empty() ? "" : "; ") + "all-to-alls over " + std::to_string(U) +
           " Ulysses ranks: q|k|v, and in backward the output and its gradient, to the heads; " +
           "the output and the q|k|v gradients back";
  }
  if (recomputed > 0) how += "; the forward's again for each recomputed layer";
  return {"cp", cfg.train.grad_accum_steps * (layers * per_layer + recomputed * forward), how};
}

// Expert parallelism's all-to-alls per step (model/moe.cpp), assuming balanced routing: per MoE
// layer and micro-batch each of the rank's tokens x top_k rows goes to an expert on another ep
// rank with probability (ep - 1) / ep, there and back in forward and again in backward, after one
// all-to-all of the rows' counts; a recomputed MoE layer's forward sends again.
AxisVolume expert_volume(const Config& cfg, int ep, double tokens, double moe_layers,
                         double recomputed) {
  const ModelConfig& m = cfg.model;
  const double rows = tokens * m.moe_top_k * (ep - 1) / ep * m.d_model * 4;
  const double counts = double(ep - 1) * (m.moe_experts / ep) * 4;
  const double per_step = cfg.train.grad_accum_steps *
                          (moe_layers * (4 * rows + counts) + recomputed * (2 * rows + counts));
  return {"ep", per_step,
          "token rows to their experts' ranks and back, in forward and in backward, per MoE layer "
          "and micro-batch, with balanced routing (the measured figure follows the routing)"};
}

}  // namespace

CommAxis AxisVolume::metered() const {
  for (CommAxis a : {CommAxis::tp, CommAxis::pp, CommAxis::cp, CommAxis::ep})
    if (axis == comm_axis_name(a)) return a;
  return CommAxis::dp;
}

CommTraffic predicted_traffic(const std::vector<AxisVolume>& volumes) {
  CommTraffic t;
  for (const AxisVolume& v : volumes) t[v.metered()].bytes += std::llround(v.bytes);
  return t;
}

std::vector<AxisVolume> comm_volume(const Config& cfg, const Layout& layout) {
  const Mesh& mesh = layout.mesh;
  const int tp = mesh.degree(Axis::tp), R = mesh.degree(Axis::dp_replicate);
  const int cp = mesh.degree(Axis::cp);
  // cp ranks hold the same weights: the data axes are dp_replicate x dp_shard x cp, sharded over
  // dp_shard x cp (parallel/axis_table.h).
  const int S = mesh.degree(Axis::dp_shard) * cp, dp = R * S;
  const std::string shard_axes = cp > 1 ? "dp_shard x cp" : "dp_shard";
  const ModelConfig& m = cfg.model;
  const TrainConfig& t = cfg.train;
  const double accum = t.grad_accum_steps;
  // One rank's micro-batch: its samples' seq_len / cp tokens each.
  const double tokens = double(t.micro_batch_size / (dp / cp)) * t.seq_len / cp;
  const double rows = tokens * m.d_model;
  // This rank's parameters: its tp share of its pipeline stages, as the trainer builds it.
  const std::vector<ModelChunk> chunks = stage_chunks(layout, 0);
  double layers = 0, embedding = 0, head = 0;
  double recomputed = 0;  // activation checkpointing: blocks whose forward runs twice
  double moe_layers = 0, moe_recomputed = 0;
  for (const ModelChunk& c : chunks) {
    layers += c.end_layer - c.first_layer;
    embedding += c.embedding;
    head += c.head;
    for (int l = c.first_layer; l < c.end_layer; ++l) {
      const bool again = t.activation_checkpointing == "full" && l % t.ac_every == 0;
      recomputed += again;
      moe_layers += m.is_moe_layer(l);
      moe_recomputed += again && m.is_moe_layer(l);
    }
  }
  int ep = 1;
  for (const CarvedAxis& c : mesh.carved()) ep = c.name == kEp ? c.degree : ep;
  const std::unique_ptr<Transformer> model =
      Transformer::planned(m, tp, cfg.parallel.sequence_parallel, chunks, t.dtype, 16 * S);
  const ParamStore& store = model->params();
  // ZeRO-3's gathers with parallel.fp8_allgather send the FP8 linears' weights as one byte per
  // value (parallel/fp8_allgather.h); fp8_floats: those weights, all and the experts'.
  // fp8_of[g][u]: those of group g in unit u.
  double fp8_floats = 0, fp8_expert_floats = 0;
  std::vector<std::vector<double>> fp8_of(size_t(store.n_groups()),
                                          std::vector<double>(size_t(model->n_units()), 0.0));
  if (cfg.parallel.fp8_allgather)
    for (int i = 0; i < int(store.tensors().size()); ++i) {
      if (!store.fp8_weight(i)) continue;
      const ParamTensor& w = store.tensor(i);
      fp8_floats += double(w.numel);
      fp8_of[size_t(w.group)][size_t(w.unit)] += double(w.numel);
      if (store.group_name(w.group) == "experts") fp8_expert_floats += double(w.numel);
    }
  // ZeRO-3's parameter gathers, as many of each unit as the step program starts: a gather of the
  // unit's region of each group (the experts' or the others', a `share` of it on this rank) over
  // p ranks, its FP8 weights at one byte per value.
  const std::vector<int> gathers =
      cfg.parallel.zero_stage == 3
          ? zero3_gathers(training_program(t, cfg.parallel, layout, 0, *model), model->n_units())
          : std::vector<int>(size_t(model->n_units()), 0);
  auto parameter_gathers = [&](bool experts, double share, int p) {
    double bytes = 0;
    for (int g = 0; g < store.n_groups(); ++g) {
      if ((store.group_name(g) == "experts") != experts) continue;
      const std::vector<int64_t>& bounds = store.unit_bounds(g);
      for (int u = 0; u < model->n_units(); ++u) {
        const double n = double(bounds[size_t(u) + 1] - bounds[size_t(u)]) * share;
        const double f = fp8_of[size_t(g)][size_t(u)] * share;
        bytes += gathers[size_t(u)] * (ring_gather(n - f, p) + ring_gather(f, p) / 4);
      }
    }
    return bytes;
  };
  double partial = 0;  // floats of gradients summed over tp (sequence parallelism's norms)
  double kv = 0;       // and over the ranks sharing a kv head
  for (const ParamTensor& p : store.tensors()) {
    if (p.placement.shard_dim < 0 && p.placement.pending == kTpAxis) partial += double(p.numel);
    for (const Segment& s : p.placement.segments)
      if (s.pending == kKvReplicasAxis) kv += double(s.length * (p.numel / p.shape[0]));
  }
  const int kv_replicas = tp > m.n_kv_heads ? tp / m.n_kv_heads : 1;
  std::vector<AxisVolume> out;
  if (tp > 1) {
    // Per micro-batch: 2 all-reduces of the rows per block each way, the embedding's sum, the
    // head's input gradient; the loss's all-gather of 3 floats per token. With sequence
    // parallelism each all-reduce is an all-gather plus a reduce-scatter, the same volume, and
    // backward gathers each block's two column-parallel inputs again (none is kept).
    const bool sp = cfg.parallel.sequence_parallel;
    // A recomputed block's forward communicates again (2 all-reduces, or their SP pairs).
    const double activations =
        (4 * layers + 2 * recomputed + embedding + head) * ring_all_reduce(rows, tp) +
        (sp ? 2 * layers * ring_gather(rows, tp) : 0);
    const double loss = head * 3 * tokens * 4 * (tp - 1);
    out.push_back({"tp", accum * (activations + loss) + ring_all_reduce(partial, tp) +
                             ring_all_reduce(kv, kv_replicas),
                   std::to_string(int(4 * layers + embedding + head)) +
                       (sp ? " all-gather + reduce-scatter pairs" : " all-reduces") +
                       " of b x s x h per micro-batch (2 per block each way" +
                       (embedding > 0 ? ", embedding" : "") + (head > 0 ? ", head" : "") + ")" +
                       (sp ? ", 2 all-gathers per block again in backward" : "") +
                       (head > 0 ? ", the loss's all-gather of 3 floats per token" : "") +
                       (partial > 0 ? "; the norms' gradients all-reduced once per step" : "") +
                       (kv > 0 ? "; the replicated kv heads' gradients all-reduced once per step"
                               : "")});
  }
  // The experts' gradients sum over dp_replicate x efsdp when ep splits them: their volume (this
  // rank's 1 / ep of them) joins the dense parameters', over the smaller group.
  const double P_experts = store.n_groups() > 1 ? double(store.global_count(1)) / ep : 0;
  if (dp > 1 && ep > 1) {
    const int efsdp = S / ep, edp = R * efsdp, zero = cfg.parallel.zero_stage;
    const double e = zero <= 1 ? ring_all_reduce(P_experts, edp) + (zero == 1 ? ring_gather(P_experts, efsdp) : 0)
                 : zero == 2 ? 2 * ring_gather(P_experts, efsdp) + ring_all_reduce(P_experts / efsdp, R)
                             : ring_gather(P_experts, efsdp) +
                                   parameter_gathers(true, 1.0 / ep, efsdp) +
                                   ring_all_reduce(P_experts / efsdp, R);
    if (e > 0)
      out.push_back({"efsdp", e, "the experts' gradient reduction over dp_replicate x efsdp (" +
                                     std::to_string(edp) + " ranks), as the dense parameters' "
                                     "over theirs" +
                                     (fp8_expert_floats > 0 && zero == 3
                                          ? " (their FP8 weights gathered in FP8 bytes)"
                                          : "")});
  }
  if (dp > 1) {
    // Each group's region as the trainer lays it out, its units padded to equal shards: what
    // its collectives move.
    double P = 0;
    for (int g = 0; g < store.n_groups(); ++g)
      if (g == 0 || ep == 1)
        P += double(store.unit_bounds(g).back() - store.unit_bounds(g).front());
    const int zero = cfg.parallel.zero_stage;
    if (zero <= 1) {
      out.push_back({"dp", ring_all_reduce(P, dp),
                     std::string("gradient all-reduce in buckets over dp_replicate x dp_shard") +
                         (cp > 1 ? " x cp" : "")});
      if (zero == 1)
        out.push_back({shard_axes, ring_gather(P, S), "all-gather of the updated shards"});
    } else {
      const double gathered = zero == 2 ? ring_gather(P, S)
                                        : parameter_gathers(false, 1, S) +
                                              (ep == 1 ? parameter_gathers(true, 1, S) : 0);
      out.push_back({shard_axes, ring_gather(P, S) + gathered,
                     std::string("gradient reduce-scatter, ") +
                         (zero == 2 ? "all-gather of the updated shards"
                                    : "parameter all-gathers before each forward and backward") +
                         (fp8_floats > 0 ? " (the FP8 linears' weights in FP8 bytes)" : "")});
      if (R > 1)
        out.push_back({"dp_replicate", ring_all_reduce(P / S, R), "all-reduce of the gradient shards"});
    }
  }
  if (cp > 1) out.push_back(context_volume(cfg, layout, tokens, layers, recomputed));
  if (ep > 1) out.push_back(expert_volume(cfg, ep, tokens, moe_layers, moe_recomputed));
  const int pp = mesh.degree(Axis::pp);
  if (pp > 1) {
    // Per micro-batch, each stage's output to the next stage's rank and its input's gradient to
    // the previous one's (none between two stages of one rank); GPT-2's tied embedding gradient
    // all-reduced over the first and the last stage once per step.
    const StageMap& stages = layout.check.stages;
    const int last = int(stages.rank_of_stage.size()) - 1;
    double sends = 0;
    for (int st = 0; st <= last; ++st) {
      if (stages.rank_of_stage[size_t(st)] != 0) continue;
      sends += st < last && stages.rank_of_stage[size_t(st) + 1] != 0;
      sends += st > 0 && stages.rank_of_stage[size_t(st) - 1] != 0;
    }
    const int tied = model->pipeline_tied_tensor();
    const double tied_floats = tied >= 0 ? double(store.tensor(tied).numel) : 0;
    out.push_back({"pp", accum * sends * (rows / (cfg.parallel.sequence_parallel ? tp : 1)) * 4 +
                             ring_all_reduce(tied_floats, 2),
                   std::to_string(int(sends)) + " point-to-point transfers of b x s x h per "
                   "micro-batch (activations forward, their gradients backward)" +
                       (tied >= 0 ? "; the tied embedding's gradient all-reduced over the first "
                                    "and last stage once per step"
                                  : "")});
  }
  return out;
}

}  // namespace cleave
