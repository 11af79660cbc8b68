// cleave's model as llama.cpp's GGUF tensors: names, [out, in] shapes, stacked experts, what stays
// f32, the features llama.cpp cannot express refused by name, and the q/k row order that makes
// llama.cpp's adjacent-pair rotary embedding rotate what cleave's rotate-half one rotates.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cleave/kernels/rope.h"
#include "cleave/model/gguf_model.h"
#include "test_util.h"

namespace cleave {
namespace {

ModelConfig tiny(Family family) {
  ModelConfig c;
  c.family = family;
  c.vocab_size = 40;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = family == Family::llama ? 2 : 4;
  c.ffn_hidden = 24;
  c.max_seq_len = 12;
  c.tie_embeddings = family == Family::gpt2;
  return c;
}

std::map<std::string, GgufTensorPlan> by_name(const ModelConfig& c) {
  std::map<std::string, GgufTensorPlan> m;
  for (GgufTensorPlan& t : gguf_tensor_plan(c)) {
    int64_t n = 1, parts = 0;
    for (int64_t d : t.shape) n *= d;
    for (const HfEntry& e : t.parts) parts += e.hf_numel();
    EXPECT_EQ(n, parts) << t.name << ": its shape and its parts hold different counts";
    EXPECT_TRUE(m.emplace(t.name, t).second) << t.name << " twice";
  }
  return m;
}

TEST(GgufModel, LlamaWithGqaAndMixtralExperts) {
  ModelConfig c = tiny(Family::llama);
  c.moe_experts = 3;
  c.moe_ffn_hidden = 8;
  const auto m = by_name(c);
  EXPECT_EQ(m.size(), 1 + 2 * 10 + 2u);  // embedding, 10 per layer, final norm, untied head
  EXPECT_EQ(m.at("token_embd.weight").shape, (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(m.at("blk.1.attn_q.weight").shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(m.at("blk.1.attn_q.weight").rope_heads, 4);
  EXPECT_EQ(m.at("blk.1.attn_k.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(m.at("blk.1.attn_k.weight").rope_heads, 2);
  EXPECT_EQ(m.at("blk.1.attn_v.weight").rope_heads, 0);
  EXPECT_EQ(m.at("blk.0.ffn_gate_exps.weight").shape, (std::vector<int64_t>{3, 8, 16}));
  EXPECT_EQ(m.at("blk.0.ffn_down_exps.weight").shape, (std::vector<int64_t>{3, 16, 8}));
  const GgufTensorPlan& up = m.at("blk.0.ffn_up_exps.weight");
  ASSERT_EQ(up.parts.size(), 3u);
  EXPECT_EQ(up.parts[2].param, "blocks.0.moe.experts.2.fc.weight");
  EXPECT_EQ(up.parts[2].row0, 8);  // SwiGLU's up projection: fc's second half
  EXPECT_TRUE(m.at("blk.0.ffn_gate_inp.weight").keep_f32);  // the router picks experts
  EXPECT_TRUE(m.at("blk.0.attn_norm.weight").keep_f32);
  EXPECT_FALSE(up.keep_f32);
  EXPECT_TRUE(m.count("output.weight"));
  c.tie_embeddings = true;
  EXPECT_FALSE(by_name(c).count("output.weight"));  // llama.cpp reuses token_embd
}

TEST(GgufModel, Gpt2KeepsLinearWeightsOutByIn) {
  const auto m = by_name(tiny(Family::gpt2));
  EXPECT_EQ(m.size(), 2 + 2 * 12 + 2u);
  EXPECT_EQ(m.at("position_embd.weight").shape, (std::vector<int64_t>{12, 16}));
  const GgufTensorPlan& qkv = m.at("blk.0.attn_qkv.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(qkv.parts[0].layout, HfLayout::same);  // not Conv1D's transpose
  EXPECT_EQ(qkv.rope_heads, 0);
  EXPECT_EQ(m.at("blk.1.ffn_up.weight").shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(m.at("blk.1.ffn_down.bias").shape, (std::vector<int64_t>{16}));
  EXPECT_TRUE(m.count("output_norm.bias"));
  EXPECT_FALSE(m.count("output.weight"));  // tied
}

TEST(GgufModel, RefusesWhatLlamaCppCannotExpress) {
  auto refused = [](const ModelConfig& c, const std::string& says) {
    const std::string e = test_util::error_of([&] { gguf_tensor_plan(c); });
    EXPECT_NE(e.find(says), std::string::npos) << e;
  };
  ModelConfig moe = tiny(Family::llama);
  moe.moe_experts = 4;
  moe.moe_ffn_hidden = 8;
  ModelConfig c = moe;
  c.moe_router = MoeRouter::sigmoid_bias;
  refused(c, "the sigmoid_bias router");
  c.moe_router = MoeRouter::softmax_topk;
  refused(c, "the softmax_topk router");
  c = moe;
  c.moe_shared_experts = 1;
  refused(c, "shared experts");
  c = moe;
  c.moe_first_dense = 1;
  refused(c, "dense layers among the MoE layers");
  c = moe;
  c.family = Family::gpt2;
  c.n_kv_heads = c.n_heads;
  refused(c, "a GPT-2 with experts");
}

// llama.cpp's NORM rotary embedding (ggml's rope, mode 0): pairs (2i, 2i + 1) of each head.
void rope_adjacent(float* x, int heads, int hd, int pos, float theta) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      const double a = pos * std::pow(double(theta), -2.0 * i / hd);
      float* p = x + h * hd + 2 * i;
      const float x0 = p[0], x1 = p[1];
      p[0] = float(x0 * std::cos(a) - x1 * std::sin(a));
      p[1] = float(x0 * std::sin(a) + x1 * std::cos(a));
    }
}

TEST(GgufModel, RopeRowsTurnRotateHalfIntoAdjacentPairs) {
  const int heads = 3, hd = 8, cols = 5, pos = 7;
  const float theta = 10000.0f;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> w(heads * hd * cols), x(cols);
  for (float& v : w) v = normal(rng);
  for (float& v : x) v = normal(rng);
  auto times = [&](const std::vector<float>& m) {
    std::vector<float> y(heads * hd, 0.0f);
    for (int r = 0; r < heads * hd; ++r)
      for (int k = 0; k < cols; ++k) y[r] += m[r * cols + k] * x[k];
    return y;
  };
  // cleave: q = W x, rotated by its kernel.
  std::vector<float> q = times(w);
  const kernels::RopeTable table(hd, pos + 1, theta);
  const int32_t position = pos;
  kernels::rope_forward(q.data(), table, 1, heads, heads * hd, &position);
  // llama.cpp: the reordered W's product, rotated in adjacent pairs.
  std::vector<float> w2 = w;
  gguf_rope_rows(w2.data(), heads, hd, cols);
  std::vector<float> q2 = times(w2);
  rope_adjacent(q2.data(), heads, hd, pos, theta);
  // Element 2i + t of llama.cpp's head is element t * hd/2 + i of cleave's.
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < hd / 2; ++i)
      for (int t = 0; t < 2; ++t)
        EXPECT_NEAR(q2[h * hd + 2 * i + t], q[h * hd + t * hd / 2 + i], 1e-5)
            << "head " << h << " pair " << i;
}

}  // namespace
}  // namespace cleave
