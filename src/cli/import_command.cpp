// cleave import HF_DIR OUT_CHECKPOINT: a Hugging Face folder as a cleave checkpoint of step 0
// (checkpoint/hf_import.h), for train.init_from, generate and export.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cleave/checkpoint/hf_import.h"
#include "cleave/data/tokenizer.h"
#include "cleave/train/config.h"
#include "cli/args.h"

namespace fs = std::filesystem;

namespace cleave::cli {

int import_hf(int argc, char** argv) {
  const Args a = Args::parse("import", argc, argv, {});
  if (a.positional.size() != 2) throw Error("cleave import: expected HF_DIR OUT_CHECKPOINT");
  const std::string out = a.positional[1];
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec)))
    throw Error("cleave import: " + out + " exists; import writes a new checkpoint folder: remove "
                "it or choose another OUT_CHECKPOINT");
  const HfFolder hf(a.positional[0]);
  // The checkpoint's resolved config: the folder's [model], the defaults elsewhere, and data.dir
  // the checkpoint itself, which holds the tokenizer (generate and export look there).
  Config cfg;
  cfg.model = hf.model();
  cfg.data.dir = fs::absolute(out).lexically_normal().string();
  cfg.train.seq_len = std::min<int64_t>(cfg.train.seq_len, cfg.model.max_seq_len);
  const int64_t params = hf.write_checkpoint(out, to_toml(cfg), cfg.train.seed);
  const ModelConfig& m = cfg.model;
  std::string shape = std::to_string(m.n_layers) + " layers, d_model " + std::to_string(m.d_model) +
                      ", " + std::to_string(m.n_heads) + " heads, " + std::to_string(m.n_kv_heads) +
                      " kv heads, vocabulary " + std::to_string(m.vocab_size);
  if (m.tie_embeddings) shape += ", tied embeddings";
  if (m.moe_experts > 0)
    shape += ", " + std::to_string(m.moe_experts) + " experts, top " + std::to_string(m.moe_top_k);
  if (hf.model_type() == "cleave_moe")
    shape += ", " + std::string(family_name(m.family)) + " family";
  std::string dtypes;
  for (const auto& [dtype, n] : hf.dtypes())
    dtypes += (dtypes.empty() ? "" : ", ") + std::to_string(n) + " " + dtype;
  std::printf("imported %s (%s) from %s: %lld parameters in %d tensors (%s) of %zu file%s, as "
              "fp32\n",
              hf.model_type().c_str(), shape.c_str(), a.positional[0].c_str(), (long long)params,
              hf.tensors(), dtypes.c_str(), hf.files().size(), hf.files().size() == 1 ? "" : "s");
  if (!hf.ignored().empty())
    std::printf("left out %zu buffers that are no parameters (%s, ...)\n", hf.ignored().size(),
                hf.ignored().front().c_str());
  std::printf("wrote checkpoint %s: step 0, empty optimizer state (train.init_from = \"%s\" "
              "starts a run from it)\n", out.c_str(), out.c_str());
  for (const std::string& file : hf.tokenizer_files())
    std::printf("copied %s to %s/%s\n", file.c_str(), out.c_str(),
                fs::path(file).filename().c_str());
  // The model's weights are of use without a tokenizer cleave reads (train.init_from), so a
  // tokenizer it cannot read is reported, not an error.
  const std::string tokenizer = find_tokenizer(out);
  if (tokenizer.empty()) {
    std::printf("the folder has neither tokenizer.model nor tokenizer.json: cleave generate "
                "needs --tokenizer\n");
    return 0;
  }
  try {
    const std::unique_ptr<Tokenizer> tok = open_tokenizer(tokenizer);
    const bool fits = tok->vocab_size() == m.vocab_size;
    std::printf("tokenizer %s: %s, vocabulary %d%s\n", tokenizer.c_str(), tok->kind(),
                tok->vocab_size(), fits ? "" : ", not the model's: generate needs --tokenizer");
  } catch (const std::exception& e) {
    std::printf("tokenizer %s cannot be read (%s): cleave generate needs --tokenizer\n",
                tokenizer.c_str(), e.what());
  }
  return 0;
}

}  // namespace cleave::cli
