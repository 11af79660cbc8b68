// The decoder-only language model: embeddings, blocks, final norm, LM head and the fused
// cross-entropy loss, or this rank's chunks of it under pipeline parallelism. It runs unit by
// unit (the embeddings, each block, the head) on activation slots, one per micro-batch in flight:
// a step program (pipeline/program.h) says which unit runs on which slot, and data
// parallelism gathers, releases and reduces units between those calls. Forward keeps what
// backward needs; backward accumulates into the flat gradient buffer of params().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "cleave/base/batch.h"
#include "cleave/model/block.h"
#include "cleave/model/fp8_amax.h"
#include "cleave/model/kv_pool.h"
#include "cleave/model/model_config.h"
#include "cleave/model/stage_link.h"

namespace cleave {

// A contiguous run of layers this rank holds: one pipeline stage (docs/pipeline_parallel.md).
// The first stage also holds the embeddings, the last the final norm, the LM head and the loss.
struct ModelChunk {
  int first_layer = 0, end_layer = 0;  // layers [first_layer, end_layer)
  bool embedding = false, head = false;
};

// Parameters that take part in matrix products (LM head included) of the whole model, counting
// only a token's active experts in a MoE layer (the router, top_k experts and the shared ones):
// the 6 * P of MFU.
int64_t matmul_params(const ModelConfig& cfg);
// The model FLOPs of one token in a training step, as MFU counts them (docs/architecture.md,
// MFU): 6 x matmul parameters + 6 x layers x sequence x d_model (causal attention, halved).
double model_flops_per_token(const ModelConfig& cfg, int seq_len);

class Transformer {
 public:
  // pad_multiple: every unit of parameters (see units) starts at a multiple of it, and the flat
  // buffer's size is one (equal ZeRO shards of each unit). Every tensor is in group 0 ("dense")
  // but a MoE layer's routed experts, which are in group 1 ("experts") with or without ep; the
  // group, not the tensor, says the data-parallel placement (model/placement.h).
  // values: initialised from the seed, unset (ZeRO-3 builds only its shards; a checkpoint's
  // values are read in), or planned (never touched).
  // tp: this rank's share of a tensor-parallel model (docs/tensor_parallel.md): its heads and
  // hidden units in every block, and its rows of the vocabulary in the embedding, the LM head and
  // the loss.
  // chunks: the stages this rank holds, in increasing layer order (empty: the whole model).
  // cp: the rank's place in context parallelism (docs/context_parallel.md): its batches hold two
  // zigzag chunks of each sequence, and attention exchanges keys and values with the cp ranks.
  // GPT-2's tied LM head on a rank without the embeddings holds a copy of embed.wte
  // (Placement::tied_copy) whose gradient the trainer sums with the first stage's.
  // ep: expert parallelism (model/moe.h) for a model with MoE layers: this rank holds E / ep of
  // each layer's routed experts.
  Transformer(const ModelConfig& cfg, Precision precision, uint64_t seed, int64_t pad_multiple = 1,
              ParamValues values = ParamValues::seeded, const TensorParallelOptions& tp = {},
              std::vector<ModelChunk> chunks = {}, const ContextParallelOptions& cp = {},
              EpComm* ep = nullptr);

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  // fp8 mode: the recipe of every FP8 product (the blocks' linears; the LM head and MoE routers
  // stay bf16 and fp32, as in Transformer Engine's and DeepSeek-V3's recipes), "current" scales'
  // amaxes completed over tp and cp (GroupAmax).
  void set_fp8(kernels::Fp8Recipe recipe, int margin);
  // This rank's FP8 products by weight name.
  std::vector<std::pair<std::string, LinearGemm*>> fp8_gemms();
  // Whoever writes the values says so to params() (ParamStore::wrote and friends).
  ParamStore& params() { return store_; }
  const ParamStore& params() const { return store_; }

  // Units of parameters (ParamStore::begin_unit), in forward order chunk by chunk. A unit's
  // compute reads the values and writes the gradients of the units in `uses`: itself, and for a
  // tied LM head beside the embeddings, the embeddings' unit too.
  enum class UnitKind { embedding, block, head };
  struct Unit {
    UnitKind kind = UnitKind::block;
    int layer = -1;  // blocks
    int chunk = 0;
    std::vector<int> uses;
  };
  int n_units() const { return int(units_.size()); }
  const std::vector<Unit>& units() const { return units_; }
  const std::vector<ModelChunk>& chunks() const { return chunks_; }
  const std::vector<int>& chunk_units(int chunk) const { return chunk_units_[size_t(chunk)]; }
  // The tied embedding's tensor on a pipeline rank that shares it with another (-1: none).
  int pipeline_tied_tensor() const { return tied_tensor_; }

  // Micro-batches of B sequences of T tokens; slots[c] activation slots for chunk c.
  void prepare(int64_t B, int64_t T, const std::vector<int>& slots);
  // The activations entering a chunk without the embeddings (received from the previous stage),
  // and its output; the gradient of a chunk's output (received from the next stage) and of its
  // input (valid after backward of the chunk's first unit, sent to the previous stage). Each is
  // the rank's rows: local_rows(B x T) x d_model floats.
  float* chunk_input(int chunk, int slot);
  const float* chunk_output(int chunk, int slot);
  float* chunk_output_grad(int chunk, int slot);
  const float* chunk_input_grad(int chunk, int slot);
  int64_t stream_floats() const { return local_rows(B_ * T_) * cfg_.d_model; }

  // One unit on one slot, on the micro-batch `batch` (which must stay unchanged until the slot's
  // backward). The embeddings read tokens and positions, attention positions and documents, the
  // head targets and the loss mask; with grad_scale != 0 the head prepares the backward of
  // grad_scale * sum(losses) (a masked token's loss is 0). Within a chunk, forward
  // runs units in order and backward in reverse, each unit's backward (or its input part) right
  // after the one above it for the same slot.
  void forward_unit(int unit, int slot, const Batch& batch, float grad_scale);
  void backward_unit(int unit, int slot, BackwardPart part = BackwardPart::both);
  // Activation checkpointing's two halves, for a block's unit after its forward on the slot:
  // release_saved frees what the block saved for backward (its input stays in the chunk's
  // stream), recompute runs its forward again on the same input and rebuilds it, bitwise. With
  // selective recompute they free and rebuild only what is cheap (Block::release_recomputable).
  void release_saved(int unit, int slot);
  void recompute(int unit, int slot);
  void set_selective_recompute(bool selective) { selective_recompute_ = selective; }
  // Chunked loss (Liger's fused linear cross-entropy): the head's forward runs `tokens` rows at a
  // time and, when it prepares a backward, the head's gradients too, so the logits exist for one
  // chunk only; the head's backward then only passes the input gradient on. 0 (or at least the
  // micro-batch's tokens): one chunk. Call before prepare.
  void set_loss_chunk(int64_t tokens) { loss_chunk_ = tokens; }
  // After the head's forward: losses(slot)[i] is the loss of token i (the same on every tp rank).
  const float* losses(int slot) const { return head_slot(slot).losses.data(); }

  // The whole model on slot 0 (one process, tests and tools): every unit's forward, then every
  // unit's backward. The second form takes B whole sequences of T tokens, every target counting.
  void forward(const Batch& batch, float grad_scale);
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               float grad_scale);
  void backward();
  const float* losses() const { return losses(0); }
  // Valid after a forward with grad_scale 0 and an unchunked loss: [N, vocab] at tp = 1, else the
  // rank's columns.
  const float* logits() const;

  // Inference (docs/inference.md): a key/value pool of `blocks` blocks of block_rows tokens for
  // the layers and kv heads this rank holds, in fp32 or bf16; what one token takes in it, keys and
  // values.
  KvPool new_pool(int64_t blocks, int64_t block_rows = kernels::kAttentionKeyBlock,
                  KvDtype dtype = KvDtype::fp32) const;
  int64_t kv_bytes_per_token(KvDtype dtype = KvDtype::fp32) const;
  // One forward of a ragged batch over the pool (Batch::cached), the training forward's units on
  // slot 0: the new tokens' keys and values go into their blocks, and the head computes the
  // logits of batch.logit_rows alone, [logit_rows, vocab_size] on every tp rank, with no loss.
  // A rank that holds one pipeline stage takes its input from, and gives its output and the
  // logits to, the other stages through `link` (set_stage_link); the logits reach every stage.
  const float* forward_cached(const Batch& batch, KvPool& pool);
  void set_stage_link(StageLink* link) { stage_link_ = link; }

  // For planning: what tp rank 0 of tp ranks holds of `chunks`, built without communication and
  // without touching the parameter buffers (mapped, never written). It cannot run; its linears
  // have the products of `precision` (which of them are FP8: ParamStore::fp8_weight), its units
  // padded to pad_multiple as the trainer pads them for ZeRO's shards.
  static std::unique_ptr<Transformer> planned(const ModelConfig& cfg, int tp, bool sequence_parallel,
                                              std::vector<ModelChunk> chunks = {},
                                              Precision precision = Precision::fp32,
                                              int64_t pad_multiple = 1);


  // The activation memory formula's parts (parallel/activation_memory.h), for micro-batches of
  // B x T tokens: what block unit `unit` saves per micro-batch, and the bytes of the buffers
  // prepare(B, T, slots) sizes (every slot's stream, the gradients between units and the head's
  // input, logits and losses, a loss chunk's rows at a time).
  SavedBytes block_saved_bytes(int unit, int64_t B, int64_t T) const;
  int64_t slot_bytes(int64_t B, int64_t T, const std::vector<int>& slots) const;
  // The floats of one slot of chunk k (any chunk of this model's layers), as slot_bytes counts
  // them: the planner's bound on a layout's memory (plan/layout_bounds.h).
  int64_t slot_floats(const ModelChunk& k, int64_t B, int64_t T) const {
    return slot_shape(k, B * T).floats();
  }
  // The bytes of the blocks' shared backward scratch (BlockGrads) prepare(B, T) reserves: sized
  // by reserving it, so the figure is the reservation's own.
  int64_t backward_scratch_bytes(int64_t B, int64_t T) const;
  // The per-thread buffers its linears' products share (LinearGemm::thread_scratch_bytes), for
  // N rows a micro-batch: the largest use of each over the linears, the head's at its chunk.
  LinearGemm::ThreadScratch product_scratch_bytes(int64_t N) const;

  // The MoE layers this rank holds: each one's routing statistics since the last call, and
  // sigmoid_bias's update from the step's global load per expert (Moe::update_bias).
  std::vector<MoeLayerStats> take_moe_stats();
  std::vector<Moe*> moe_layers();
  void update_moe_bias(int layer, const std::vector<double>& load);
  // The router biases of the MoE layers this rank holds, by layer (sigmoid_bias; checkpoints).
  std::vector<std::pair<int, std::vector<float>*>> moe_biases();
  std::map<int, std::vector<float>> moe_bias_values();  // the same, copied

 private:
  // A chunk's activations for one micro-batch, and the gradient flowing between its units, so
  // that a unit's backward on one slot may follow the next unit's after any other instructions.
  struct Slot {
    std::vector<Buffer<float>> stream;  // the chunk's input and each block's output
    Buffer<float> d_output, d_input;    // gradients at the chunk's ends
    Buffer<float> d_a, d_b;             // the gradient between units, alternating
    const float* d_stream = nullptr;    // where it is now
    const Batch* batch = nullptr;
    Buffer<float> hf, hf_full, logits, losses;  // the head (logits: one chunk's when chunked)
    Buffer<float> d_head_in;  // chunked loss: the head input's gradient, from its forward
    OperandCopy head_x;                         // the head's input in bf16 (bf16 mode)
    NormStats final_norm;
    float grad_scale = 0;  // of its forward: a full recompute runs with the same
  };
  // The floats of one slot's buffers of chunk k, for micro-batches of N tokens.
  struct SlotShape {
    int64_t streams = 0, stream = 0;         // the chunk's input and each block's output
    int64_t hf = 0, hf_full = 0, logits = 0, losses = 0, d_head_in = 0;  // the head's
    int64_t floats() const { return streams * stream + 4 * stream + hf + hf_full + logits + losses + d_head_in; }
  };
  SlotShape slot_shape(const ModelChunk& k, int64_t N) const;
  // The floats of the model's own activation buffers (not per slot), likewise.
  struct ModelFloats {
    int64_t d_hf = 0, d_full = 0, embed_full = 0;
  };
  ModelFloats model_floats(int64_t N) const;
  Slot& slot_of(int chunk, int slot) { return slots_[size_t(chunk)].at(size_t(slot)); }
  const Slot& head_slot(int slot) const { return slots_.back().at(size_t(slot)); }
  void embed(float* out, const int32_t* tokens, const int32_t* positions, int64_t N);
  int64_t local_rows(int64_t N) const { return tp_.sequence_parallel ? N / tp_.size() : N; }
  // The loss of rows [r0, r0 + rows) from their logits (in s.logits), dlogits in place.
  void loss(Slot& s, const Batch& batch, int64_t r0, int64_t rows, float grad_scale);
  int64_t head_chunk(int64_t N) const;  // rows of logits at a time, of N
  void head_forward(Slot& s, const Batch& batch, float grad_scale);
  void head_logit_rows(Slot& s, const Batch& batch);  // inference: batch.logit_rows' logits
  void size_slots(int64_t B, int64_t T, const std::vector<int>& slots);  // prepare's, unchecked
  void head_backward(Slot& s);
  void embedding_backward(Slot& s, const float* d_stream);

  ModelConfig cfg_;
  Precision precision_;
  TensorParallelOptions tp_;
  TpShare share_;
  std::unique_ptr<TpComm> planned_group_;  // planned(): the group tp_ points to
  ParamStore store_;
  std::vector<ModelChunk> chunks_;
  std::vector<Unit> units_;
  std::vector<std::vector<int>> chunk_units_;
  std::optional<kernels::RopeTable> rope_;
  int wte_ = -1, wpe_ = -1, head_ = -1, tied_tensor_ = -1;
  std::vector<std::unique_ptr<Block>> blocks_;  // this rank's, in unit order
  std::vector<int> block_of_unit_;              // index into blocks_, or -1
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<LinearGemm> head_gemm_;
  CpComm* cp_group_ = nullptr;
  std::unique_ptr<GroupAmax> amax_tp_cp_, amax_tp_;  // fp8 "current"
  BlockGrads grads_;
  void reserve_block_grads(BlockGrads& g, int64_t N) const;
  // The activation pool: what each block unit saved for backward, per slot ([unit][slot]; empty
  // for the embeddings and the head, whose saved activations are their chunk slot's).
  std::vector<std::vector<Block::Saved>> saved_;

  int64_t B_ = 0, T_ = 0;
  std::vector<std::vector<Slot>> slots_;  // per chunk
  Buffer<float> d_hf_;                    // the head's input gradient, within its backward
  int64_t loss_chunk_ = 0;
  bool selective_recompute_ = false;
  bool recomputing_ = false;  // a full recompute's forward: no routing statistics
  // What activation checkpointing frees, for the next block's forward or recompute to take.
  RecomputeSpares spares_;
  OperandCopy d_logits_;                  // bf16 mode: the head's output gradient, likewise
  Buffer<float> stats_, all_stats_;       // tp > 1
  Buffer<float> embed_full_, d_full_;     // sequence parallelism
  Batch whole_;  // the batch of forward's whole sequences
  KvPool* pool_ = nullptr;    // forward_cached's, while it runs
  StageLink* stage_link_ = nullptr;
  Buffer<float> logit_in_;    // forward_cached: the hidden rows whose logits are asked for
  Buffer<float> logit_parts_, logits_full_;  // tp > 1: every rank's columns, and whole rows
};

}  // namespace cleave
