// cleave's model as llama.cpp reads it from a GGUF file (docs/checkpoints.md, GGUF): GPT-2 as
// architecture "gpt2", Llama (grouped-query attention included) and Mixtral-style mixtures of
// experts as "llama". Built on the Hugging Face table (model/hf_layout.h), which says which rows
// of which cleave tensor each tensor is; GGUF renames them (blk.N.attn_q.weight, ...), keeps
// every linear weight [out, in] as cleave does (GPT-2's too, not Conv1D's [in, out]), stacks a
// layer's experts into one [experts, rows, cols] tensor, and reorders the rows of q and k for
// llama.cpp's rotary embedding (gguf_rope_rows).
// What llama.cpp's architectures cannot express is an error naming it: GPT-2 with experts, a
// router other than Mixtral's, shared experts, dense layers among the MoE ones.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "cleave/base/gguf.h"
#include "cleave/model/hf_layout.h"
#include "cleave/model/model_config.h"
#include "cleave/model/params.h"

namespace cleave {

struct GgufTensorPlan {
  std::string name;            // GGUF's
  std::vector<int64_t> shape;  // row-major: [experts,] rows, cols, or [n] for a norm or bias
  std::vector<HfEntry> parts;  // what it holds, one after another (one per expert when stacked)
  int rope_heads = 0;          // > 0: q or k of that many heads, rows reordered by gguf_rope_rows
  bool keep_f32 = false;       // a norm, a bias or the router: f32 whatever the dtype
};

// The tensors llama.cpp loads for config c, in file order; the model's checks first.
std::vector<GgufTensorPlan> gguf_tensor_plan(const ModelConfig& c);

// The file's tensor table: plan's tensors, their 2-D and 3-D weights as `matrices` (f32, f16 or
// bf16), the rest (keep_f32) f32.
std::vector<gguf::TensorInfo> gguf_tensor_infos(const std::vector<GgufTensorPlan>& plan,
                                                gguf::TensorType matrices);

// cleave rotates each head's element pairs (i, i + hd/2) (Hugging Face's rotate-half); llama.cpp's
// "llama" architecture rotates (2i, 2i + 1) at the same angle pos * theta^(-2i/hd) (its NORM rope
// type). Moving row t * hd/2 + i of each head of a [heads * hd, cols] weight to row 2i + t makes
// llama.cpp's pair the pair cleave rotates; q and k reordered alike leave every q.k, so the
// attention, unchanged. In place.
void gguf_rope_rows(float* w, int heads, int64_t head_dim, int64_t cols);

// Streams the GGUF of the model whose parameters `flat` holds (laid out like `store`): the
// architecture's keys added to `meta` (which holds the tokenizer's and general.name), then every
// tensor as gguf_tensor_infos types it. A value beyond f16's range exported as f16 is an error
// naming the tensor.
void write_gguf_model(std::ostream& out, gguf::Metadata meta, const ModelConfig& c,
                      const ParamStore& store, const float* flat, gguf::TensorType matrices);

}  // namespace cleave
