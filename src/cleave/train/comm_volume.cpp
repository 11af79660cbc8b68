#include "cleave/train/comm_volume.h"

#include "cleave/model/transformer.h"

namespace cleave {

namespace {

double ring_all_reduce(double n, int p) { return p > 1 ? 2.0 * (p - 1) / p * n * 4 : 0; }
double ring_gather(double n, int p) { return p > 1 ? double(p - 1) / p * n * 4 : 0; }

}  // namespace

std::vector<AxisVolume> comm_volume(const Config& cfg, const Layout& layout) {
  const Mesh& mesh = layout.mesh;
  const int tp = mesh.degree(Axis::tp), R = mesh.degree(Axis::dp_replicate);
  const int S = mesh.degree(Axis::dp_shard), dp = R * S;
  const ModelConfig& m = cfg.model;
  const TrainConfig& t = cfg.train;
  const double accum = t.grad_accum_steps;
  const double tokens = double(t.micro_batch_size / dp) * t.seq_len;  // one rank's micro-batch
  const double rows = tokens * m.d_model;
  // This rank's parameters: its tp share of its pipeline stages, as the trainer builds it.
  const std::vector<ModelChunk> chunks = stage_chunks(layout, 0);
  double layers = 0, embedding = 0, head = 0;
  for (const ModelChunk& c : chunks) {
    layers += c.end_layer - c.first_layer;
    embedding += c.embedding;
    head += c.head;
  }
  const std::unique_ptr<Transformer> model =
      Transformer::planned(m, tp, cfg.parallel.sequence_parallel, chunks);
  const ParamStore& store = model->params();
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
    const double activations = (4 * layers + embedding + head) * ring_all_reduce(rows, tp) +
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
  if (dp > 1) {
    const double P = double(store.count());
    const int zero = cfg.parallel.zero_stage;
    if (zero <= 1) {
      out.push_back({"dp", ring_all_reduce(P, dp),
                     "gradient all-reduce in buckets over dp_replicate x dp_shard"});
      if (zero == 1)
        out.push_back({"dp_shard", ring_gather(P, S), "all-gather of the updated shards"});
    } else {
      const double gathers = zero == 2 ? 1 : 2 * accum;
      out.push_back({"dp_shard", ring_gather(P, S) * (1 + gathers),
                     std::string("gradient reduce-scatter, ") +
                         (zero == 2 ? "all-gather of the updated shards"
                                    : "parameter all-gathers before each forward and backward")});
      if (R > 1)
        out.push_back({"dp_replicate", ring_all_reduce(P / S, R), "all-reduce of the gradient shards"});
    }
  }
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
