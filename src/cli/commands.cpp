// The subcommands: each parses its arguments, then calls into the engine.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <mpi.h>
#include <omp.h>

#include "cleave/base/file.h"
#include "cleave/checkpoint/load_model.h"
#include "cleave/checkpoint/safetensors.h"
#include "cleave/comm/errors.h"
#include "cleave/data/tokenizer.h"
#include "cleave/kernels/decode_bench.h"
#include "cleave/kernels/gemm_bench.h"
#include "cleave/kernels/linear.h"
#include "cleave/model/hf_export.h"
#include "cleave/train/peak.h"
#include "cleave/train/trainer.h"
#include "cli/args.h"
#include "cli/carried_tokenizer.h"
#include "cli/export_gguf.h"

namespace fs = std::filesystem;

namespace cleave::cli {

namespace {

Config config_from(const Args& a, const std::string& command) {
  if (a.positional.size() != 1)
    throw Error("cleave " + command + ": expected one CONFIG.toml, got " +
                std::to_string(a.positional.size()) + " positional arguments");
  return load_config(a.positional[0], a.overrides);
}

}  // namespace

int train(int argc, char** argv) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Args a;
  Config cfg;
  int64_t exit_after = 0;
  // Before the comm engine starts: the command line, the config and the layout, agreed on by every
  // rank (each error reported once).
  agree_on_errors([&] {
    a = Args::parse("train", argc, argv, {"--resume", "--exit-after"});
    cfg = config_from(a, "train");
    plan_layout(cfg.model, cfg.parallel, cfg.train, world);
    exit_after = a.integer("--exit-after", 0, 1, INT64_MAX);
  });
  if (rank == 0) std::cout << "# resolved config\n" << to_toml(cfg) << std::endl;
  CommOptions comm;
  comm.timeout_seconds = cfg.parallel.comm_timeout_s;
  comm.status_dir = cfg.parallel.status_dir;
  init_comm(comm);
  // An error of this rank alone is reported while the trainer lives: unwinding it first would wait,
  // in its groups' destructors, for operations the other ranks never join.
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = std::make_unique<Trainer>(cfg, a.get("--resume", ""));
    trainer->run(exit_after);
  } catch (const std::exception& e) {
    return report_error(e);
  }
  return 0;
}

int tokenize(int argc, char** argv) {
  const Args a = Args::parse("tokenize", argc, argv, {});
  const Config cfg = config_from(a, "tokenize");
  if (cfg.data.corpus.empty()) throw Error("cleave tokenize: data.corpus is not set in the config");
  const TokenizeReport r = tokenize_corpus(cfg.data.corpus, cfg.data.dir, cfg.model.vocab_size,
                                           cfg.data.val_fraction, cfg.train.seed);
  std::printf("tokenized %s: %llu train tokens, %llu validation tokens, vocabulary %d -> %s/{tokenizer.model,train.bin,val.bin}\n",
              cfg.data.corpus.c_str(), (unsigned long long)r.train_tokens,
              (unsigned long long)r.val_tokens, cfg.model.vocab_size, cfg.data.dir.c_str());
  return 0;
}

int export_hf(int argc, char** argv) {
  const Args a = Args::parse("export", argc, argv, {"--format", "--dtype", "--tokenizer"});
  const std::string format = a.get("--format", "hf");
  if (format != "hf" && format != "gguf")
    throw Error("cleave export: --format must be hf or gguf, not '" + format + "'");
  if (a.positional.size() != 2)
    throw Error(format == "hf" ? "cleave export: expected CHECKPOINT_DIR OUT_DIR"
                               : "cleave export: expected CHECKPOINT_DIR OUT.gguf");
  if (format == "hf" && (a.has("--dtype") || a.has("--tokenizer")))
    throw Error("cleave export: --dtype and --tokenizer are options of --format gguf");
  const LoadedModel loaded = load_model(a.positional[0], Precision::fp32);
  const std::string out = a.positional[1];
  if (format == "gguf") {
    export_gguf(loaded, out, a.get("--tokenizer", carried_tokenizer(loaded)), a.get("--dtype", "f32"));
    return 0;
  }
  Transformer& model = *loaded.model;
  // Nothing is written through a link: a file of OUT_DIR that is one would have its target
  // overwritten (checked for every file before any is written).
  for (const char* file : {"model.safetensors", "config.json", "tokenizer.model", "tokenizer.json",
                           "tokenizer_config.json"}) {
    const fs::path p = fs::path(out) / file;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(p, ec)))
      throw Error("cleave export: " + p.string() + " is a symbolic link (to " +
                  fs::read_symlink(p, ec).string() + "); export writes no file through a link: "
                  "remove it or choose another OUT_DIR");
  }
  fs::create_directories(out);
  const auto tensors = hf_tensors(model.params(), model.config(), model.params().values().data(),
                                  model.moe_bias_values());
  std::vector<TensorView> views;
  for (auto& t : tensors)
    views.push_back({t.name, "F32", t.shape, t.data.data(), uint64_t(t.data.size()) * 4});
  write_safetensors(out + "/model.safetensors", views, {{"format", "pt"}});
  write_file_atomic(out + "/config.json", hf_config(model.config()).dump(2) + "\n", "config.json");
  // The tokenizer goes along, with the tokenizer_config.json beside it (its chat template).
  std::string tokenizer_files;
  if (const std::string tok = carried_tokenizer(loaded); !tok.empty()) {
    const fs::path config = fs::path(tok).parent_path() / "tokenizer_config.json";
    for (const fs::path& f : {fs::path(tok), config}) {
      if (!fs::exists(f)) continue;
      fs::copy_file(f, fs::path(out) / f.filename(), fs::copy_options::overwrite_existing);
      tokenizer_files += "," + f.filename().string();
    }
  }
  std::printf("exported %zu tensors to %s/{config.json,model.safetensors%s}\n", tensors.size(),
              out.c_str(), tokenizer_files.c_str());
  return 0;
}

int peak(int argc, char** argv) {
  const Args a = Args::parse("peak", argc, argv, {"--dtype", "--threads"}, {"--refresh"});
  if (!a.positional.empty()) throw Error("cleave peak: takes no positional arguments");
  if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 0, 1, 4096)));
  const std::string dtypes = a.get("--dtype", "all");
  if (dtypes != "all" && dtypes != "fp32" && dtypes != "bf16")
    throw Error("cleave peak: --dtype must be fp32, bf16 or all, not '" + dtypes + "'");
  PeakRequest request;
  request.threads = omp_get_max_threads();
  request.refresh = a.has("--refresh");
  request.cache_path = default_peak_cache();
  std::printf("cache: %s\n", request.cache_path.empty() ? "none (no HOME)" : request.cache_path.c_str());
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const char* name = p == Precision::fp32 ? "fp32" : "bf16";
    if (dtypes != "all" && dtypes != name) continue;
    request.precision = p;
    const ComputePeak peak = resolve_peak(request);
    std::printf("%s, %d threads: GEMM peak %.1f GF/s (%s); hardware FMA peak %s\n", name,
                request.threads, peak.gflops, source_name(peak.source),
                describe(peak.hardware).c_str());
  }
  return 0;
}

int bench_gemm(int argc, char** argv) {
  const Args a = Args::parse("bench-gemm", argc, argv, {"--seconds", "--threads"});
  if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 0, 1, 4096)));
  std::vector<std::tuple<int64_t, int, int>> shapes = gpt2_small_linear_shapes();
  std::string what = "GPT-2 124M, 1024 tokens";
  int n_layers = 12, microbatches = 1;
  bool dense = true;
  if (!a.positional.empty()) {
    const Config cfg = config_from(a, "bench-gemm");
    const ModelConfig& m = cfg.model;
    n_layers = m.n_layers;
    microbatches = cfg.train.grad_accum_steps;
    dense = m.moe_experts == 0;
    const int64_t N = int64_t(cfg.train.micro_batch_size) * cfg.train.seq_len;
    shapes = {{N, m.d_model, m.qkv_dim()},
              {N, m.n_heads * m.head_dim(), m.d_model},
              {N, m.d_model, m.mlp_in_dim()},
              {N, m.ffn_hidden, m.d_model},
              {N, m.d_model, m.vocab_size}};
    what = a.positional[0];
  }
  const double seconds = a.number("--seconds", 1.0);
  std::printf("GEMM shapes of %s, %d threads, median of repetitions\n", what.c_str(),
              omp_get_max_threads());
  std::printf("%-6s %7s %6s %6s %-10s %9s\n", "dtype", "N", "in", "out", "pass", "GF/s");
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const auto results = bench_linear_shapes(shapes, p, seconds);
    const char* name = p == Precision::fp32 ? "fp32" : "bf16";
    for (auto& r : results)
      std::printf("%-6s %7lld %6d %6d %-10s %9.1f\n", name, (long long)r.N, r.in, r.out,
                  r.pass.c_str(), r.gflops);
    std::printf("%-6s overall (FLOP-weighted): %.1f GF/s\n", name, overall_gflops(results));
    // What bench/vs_pytorch.sh sets a step's time against (a MoE layer's products are others).
    if (dense)
      std::printf("%-6s a training step's products: %.1f ms (%d layers x 4 linears and the LM "
                  "head, 3 passes, %d micro-batch%s)\n",
                  name, 1e3 * step_product_seconds(results, n_layers, microbatches), n_layers,
                  microbatches, microbatches == 1 ? "" : "es");
  }
  std::printf("\nPacking a weight into its forward and backward_input layouts (cold weights), "
              "median ms:\n%-6s %6s %6s %9s %14s %6s\n",
              "dtype", "in", "out", "cleave", "oneDNN reorder", "ratio");
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (auto& r : bench_weight_packing(shapes, p, seconds))
      std::printf("%-6s %6d %6d %9.3f %14.3f %5.2fx\n", p == Precision::fp32 ? "fp32" : "bf16",
                  r.in, r.out, r.cleave_seconds * 1e3, r.reorder_seconds * 1e3,
                  r.reorder_seconds / r.cleave_seconds);
  return 0;
}

int bench_decode(int argc, char** argv) {
  const Args a =
      Args::parse("bench-decode", argc, argv, {"--seconds", "--threads"}, {"--spread-only"});
  if (!a.positional.empty())
    throw Error("cleave bench-decode: takes no positional arguments, got '" + a.positional[0] + "'");
  if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 0, 1, 4096)));
  const double seconds = a.number_in("--seconds", 3.0, 1e-3, 3600);
  std::printf("The kernels of a decoding step, GPT-2 124M's shape (12 layers, d_model 768, 12 "
              "heads of 64), %d threads, bf16 products; medians of alternating calls\n\n",
              omp_get_max_threads());

  if (!a.has("--spread-only")) {
    const DecodeAttentionTiming at = time_decode_attention(seconds);
    std::printf("Attention of %d decoding sequences of %lld-%lld tokens, one layer (%d calls "
                "each):\n%-10s %9s %9s %10s\n",
                at.sequences, (long long)at.min_context, (long long)at.max_context, at.calls,
                "cache", "ms", "MiB read", "GB/s");
    const std::pair<const char*, std::pair<double, double>> caches[] = {
        {"fp32", {at.fp32_seconds, at.fp32_bytes}}, {"bf16", {at.bf16_seconds, at.bf16_bytes}}};
    for (const auto& [name, c] : caches)
      std::printf("%-10s %9.3f %9.1f %10.1f\n", name, 1e3 * c.first, c.second / 1048576.0,
                  c.second / c.first / 1e9);
    std::printf("bf16 cache / fp32 cache: %.2fx the time\n\n",
                at.bf16_seconds / at.fp32_seconds);

    const bool tiles = !row_invariant_products(Precision::bf16);
    std::printf("The 48 products of a step in row tiles of %lld (%s):\n%-6s %12s %14s %7s %6s\n",
                (long long)kInvariantRowTile,
                tiles ? "needed on this CPU; a call runs its tiles as one product where that "
                        "gives each tile its own bits"
                      : "not needed on this CPU: every row count gives a row the same bits",
                "rows", "one call ms", "tile calls ms", "ratio", "pairs");
    for (const auto& r : time_row_tiles({32, 48, 64, 96}, seconds))
      std::printf("%-6lld %12.2f %14.2f %6.2fx %6d\n", (long long)r.rows,
                  1e3 * r.one_call_seconds, 1e3 * r.tile_calls_seconds,
                  r.one_call_seconds / r.tile_calls_seconds, r.pairs);
    std::printf("\n");
  }

  std::printf("The spread of identical runs (%.3g s each):\n%-34s %8s %8s %8s %8s %8s %6s\n",
              2 * seconds, "work", "p50 ms", "p90 ms", "p99 ms", "max ms", "p99/p50", "runs");
  const Spread step = step_products_spread(16, 2 * seconds);
  const Spread fixed = fixed_arithmetic_spread(step.p50, 2 * seconds);
  const std::pair<const char*, Spread> spreads[] = {
      {"the 48 products at 16 rows", step}, {"arithmetic on registers alone", fixed}};
  for (const auto& [name, s] : spreads)
    std::printf("%-34s %8.2f %8.2f %8.2f %8.2f %7.2fx %6d\n", name, 1e3 * s.p50, 1e3 * s.p90,
                1e3 * s.p99, 1e3 * s.max, s.p99 / s.p50, s.runs);
  return 0;
}

}  // namespace cleave::cli
