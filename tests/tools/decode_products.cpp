// decode_products CHECKPOINT fp32|bf16 [TOKENS]: the ceiling the products put on single-sequence
// decode. Times one decoded token's products alone (every linear of the checkpoint's dense model
// and the LM head, one row each, through LinearGemm as the model runs them, weights of the
// model's shapes, each in its own memory so that none is read from cache), median over TOKENS
// (default 200) tokens, and prints "products-only decode: X tokens/s". bench/inference.sh sets it
// beside the decode it measures and the memory roofline: what the products alone reach of the
// bandwidth bounds every decode built on them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cleave/checkpoint/load_model.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (std::strcmp(argv[2], "fp32") && std::strcmp(argv[2], "bf16"))) {
    std::fprintf(stderr, "usage: decode_products CHECKPOINT fp32|bf16 [TOKENS]\n");
    return 2;
  }
  try {
    const cleave::ModelConfig c = cleave::open_model_checkpoint(argv[1]).model;
    if (c.moe_experts > 0) throw std::runtime_error("decode_products times dense models only");
    const cleave::Precision p = std::strcmp(argv[2], "bf16") ? cleave::Precision::fp32 : cleave::Precision::bf16;
    const int tokens = argc == 4 ? std::stoi(argv[3]) : 200;
    const int d = c.d_model, ffn = c.ffn_hidden;
    struct Shape {
      int in, out;
    };
    std::vector<Shape> shapes;
    for (int l = 0; l < c.n_layers; ++l) {
      shapes.push_back({d, c.qkv_dim()});
      shapes.push_back({d, d});
      shapes.push_back({d, c.family == cleave::Family::llama ? 2 * ffn : ffn});
      shapes.push_back({ffn, d});
    }
    shapes.push_back({d, c.vocab_size});
    std::vector<cleave::LinearGemm> gemms;
    std::vector<std::vector<float>> weights;
    gemms.reserve(shapes.size());
    for (const Shape& s : shapes) {
      weights.emplace_back(size_t(s.in) * s.out, 0.01f);
      gemms.emplace_back(s.in, s.out, p);
      gemms.back().set_weight(weights.back().data());
    }
    std::vector<float> x(size_t(std::max(d, ffn)), 0.1f), y(size_t(std::max({c.vocab_size, c.qkv_dim(), 2 * ffn})));
    for (auto& g : gemms) g.forward(y.data(), x.data(), 1, nullptr);  // packs, makes the primitives
    std::vector<double> times;
    for (int t = 0; t < tokens; ++t) {
      const auto t0 = std::chrono::steady_clock::now();
      for (auto& g : gemms) g.forward(y.data(), x.data(), 1, nullptr);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    std::printf("products-only decode: %.1f tokens/s\n", 1.0 / times[times.size() / 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_products: %s\n", e.what());
    return 1;
  }
  return 0;
}
