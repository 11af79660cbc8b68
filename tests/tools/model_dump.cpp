// model_dump CONFIG.toml OUT_DIR [--set key=value ...] [--perturb]
//
// Builds the model a config describes, runs one forward (logits, losses) and one forward+backward
// on deterministic tokens, and writes what an independent implementation needs to check it:
//   OUT_DIR/config.json          the Hugging Face config (hf_config)
//   OUT_DIR/model.safetensors    the parameters under Hugging Face names and layouts (F32)
//   OUT_DIR/grads.safetensors    the gradients of mean(loss), same names and layouts (F32)
//   OUT_DIR/outputs.safetensors  tokens, targets (I32 [B,T]), logits (F32 [B,T,V]), loss (F32 [1])
// The parameters are the model's own Philox init. --perturb also moves the tensors initialised to
// constants (norm weights at 1, biases at 0) to deterministic non-trivial values, so a bias or norm
// weight mishandled in forward cannot hide behind its trivial value.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cleave/base/philox.h"
#include "cleave/checkpoint/safetensors.h"
#include "cleave/model/hf_export.h"
#include "cleave/model/transformer.h"
#include "cleave/train/config.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: model_dump CONFIG.toml OUT_DIR [--set key=value ...] [--perturb]\n");
  return 2;
}

std::vector<cleave::TensorView> views(const std::vector<cleave::HfTensor>& ts) {
  std::vector<cleave::TensorView> v;
  for (auto& t : ts)
    v.push_back({t.name, "F32", t.shape, t.data.data(), uint64_t(t.data.size() * sizeof(float))});
  return v;
}

int run(int argc, char** argv) {
  std::vector<std::string> positional, overrides;
  bool perturb = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
    else if (a.rfind("--set=", 0) == 0) overrides.push_back(a.substr(6));
    else if (a == "--perturb") perturb = true;
    else if (a.rfind("--", 0) == 0) return usage();
    else positional.push_back(a);
  }
  if (positional.size() != 2) return usage();
  const std::filesystem::path out = positional[1];
  std::filesystem::create_directories(out);

  const cleave::Config cfg = cleave::load_config(positional[0], overrides);
  const cleave::ModelConfig& mc = cfg.model;
  cleave::Transformer model(mc, cfg.train.dtype, cfg.train.seed);
  cleave::ParamStore& params = model.params();

  if (perturb) {
    for (size_t i = 0; i < params.tensors().size(); ++i) {
      const cleave::ParamTensor& t = params.tensor(int(i));
      if (t.init == cleave::Init::normal) continue;
      const float base = t.init == cleave::Init::ones ? 1.0f : 0.0f;
      const uint64_t stream = cleave::hash_name(t.name);
      float* v = params.value(int(i));
      for (int64_t j = 0; j < t.numel; ++j)
        v[j] = base + 0.2f * cleave::philox_normal(cfg.train.seed + 1, stream, uint64_t(j));
    }
    model.params().wrote_all();
  }

  const int64_t B = cfg.train.micro_batch_size, T = cfg.train.seq_len, N = B * T;
  const int64_t V = mc.vocab_size;
  std::vector<int32_t> tokens(N), targets(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = int32_t((i * 7 + 3) % V);
    targets[i] = int32_t((i * 13 + 5) % V);
  }

  // Forward only: logits and per-token losses.
  model.forward(tokens.data(), targets.data(), B, T, 0.0f);
  std::vector<float> logits(model.logits(), model.logits() + N * V);
  double sum = 0.0;
  for (int64_t i = 0; i < N; ++i) sum += model.losses()[i];
  const float loss = float(sum / double(N));

  // Gradients of mean(losses).
  params.grads().zero();
  model.forward(tokens.data(), targets.data(), B, T, 1.0f / float(N));
  model.backward();

  {
    std::ofstream f(out / "config.json");
    f << cleave::hf_config(mc).dump(2) << "\n";
    if (!f) throw cleave::Error("cannot write " + (out / "config.json").string());
  }
  const auto values = cleave::hf_tensors(params, mc, params.values().data(), model.moe_bias_values());
  // A gradient of the bias (which is no parameter) does not exist: zeros in its place.
  std::map<int, std::vector<float>> no_bias = model.moe_bias_values();
  for (auto& [layer, b] : no_bias) std::fill(b.begin(), b.end(), 0.0f);
  const auto grads = cleave::hf_tensors(params, mc, params.grads().data(), no_bias);
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  cleave::write_safetensors((out / "model.safetensors").string(), views(values), meta);
  cleave::write_safetensors((out / "grads.safetensors").string(), views(grads), meta);
  cleave::write_safetensors(
      (out / "outputs.safetensors").string(),
      {{"tokens", "I32", {B, T}, tokens.data(), uint64_t(N * sizeof(int32_t))},
       {"targets", "I32", {B, T}, targets.data(), uint64_t(N * sizeof(int32_t))},
       {"logits", "F32", {B, T, V}, logits.data(), uint64_t(N * V * sizeof(float))},
       {"loss", "F32", {1}, &loss, uint64_t(sizeof(float))}},
      meta);
  std::printf("model_dump: %s family, B=%lld T=%lld V=%lld, loss %.6f -> %s\n",
              cleave::family_name(mc.family), (long long)B, (long long)T, (long long)V, loss,
              out.string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_dump: error: %s\n", e.what());
    return 1;
  }
}
