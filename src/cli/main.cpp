// cleave: the command-line front of the engine. Runs with or without mpirun.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "cleave/base/check.h"
#include "cleave/base/signal_thread.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/group.h"

namespace cleave::cli {
int train(int argc, char** argv);
int tokenize(int argc, char** argv);
int generate(int argc, char** argv);
int serve_command(int argc, char** argv);
int export_hf(int argc, char** argv);
int checkpoint(int argc, char** argv);
int plot(int argc, char** argv);
int import_hf(int argc, char** argv);
int bench_gemm(int argc, char** argv);
int bench_decode(int argc, char** argv);
int peak(int argc, char** argv);
int bench_comm(int argc, char** argv);
int calibrate(int argc, char** argv);
int mesh(int argc, char** argv);
int plan(int argc, char** argv);
int schedule(int argc, char** argv);
}  // namespace cleave::cli

namespace {

const char* kUsage = R"(usage: cleave COMMAND ...
  train CONFIG.toml [--set key=value ...] [--resume latest|CHECKPOINT_DIR] [--exit-after N]
  tokenize CONFIG.toml [--set key=value ...]     train the tokenizer, write token shards
  generate CHECKPOINT_DIR --prompt TEXT|--prompt-ids "ID ..." [--max-new-tokens N]
           [--temperature T] [--top-k K] [--seed S] [--tokenizer PATH] [--ids] [--dtype fp32|bf16]
           [--prefill-chunk N] [--batch N] [--kv-cache-mib M] [--kv-cache-dtype auto|fp32|bf16] [--warmup]
           PATH: tokenizer.model, tokenizer.json or a folder; --ids: token ids, not text;
           --batch: N sequences of the prompt at once, the i-th drawn with seed + i;
           --kv-cache-mib: the paged key/value pool's size (default: what the request needs);
           --kv-cache-dtype: its keys and values (auto: the weights' --dtype);
           --warmup: an untimed run first, before the timings on standard error;
           under mpirun: --set parallel.tp=T, parallel.pp=P, parallel.ep=E on T x P x E ranks
  serve CHECKPOINT_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--model-name NAME]
        [--dtype fp32|bf16] [--threads N] [--tokenizer PATH] [--chat-template auto|chatml|llama3|llama2]
        [--set serve.kv_cache_mb=M|serve.kv_cache_dtype=auto|fp32|bf16|serve.step_tokens=N|serve.max_step_ratio=R|serve.max_running=N
        |serve.max_body_bytes=B|serve.http_threads=N|serve.drain_seconds=S]   OpenAI-compatible server (docs/serving.md);
        under mpirun: --set parallel.tp=T, parallel.pp=P, parallel.ep=E on T x P x E ranks;
        CLEAVE_API_KEY sets the key
  export CHECKPOINT_DIR OUT_DIR                   Hugging Face folder (config.json, model.safetensors)
  export CHECKPOINT_DIR OUT.gguf --format gguf [--dtype f32|f16|bf16] [--tokenizer PATH]
                                                  one GGUF file for llama.cpp, tokenizer inside
  checkpoint info|verify CHECKPOINT_DIR           what a checkpoint holds | check every checksum
  plot RUN_DIR... [--out FILE.svg|.png|.pdf]      loss, validation loss, tokens/s, MFU by step
  import HF_DIR OUT_CHECKPOINT     a Hugging Face folder (GPT-2, Llama, Mixtral; F32, BF16, F16,
                                   sharded or not) as a checkpoint of step 0 for train.init_from
  bench-gemm [CONFIG.toml] [--set key=value ...] [--seconds S]   GEMM GF/s, fp32 and bf16
  bench-decode [--seconds S] [--threads N] [--spread-only]   a decoding step's kernels: attention
                                   from an fp32 and a bf16 cache, row tiles, the spread of identical
                                   steps beside arithmetic alone (--spread-only: the spread alone)
  peak [--dtype fp32|bf16] [--threads N] [--refresh]   the peaks MFU is quoted against (cached)
  bench-comm (under mpirun) [--meetings-only | --no-meetings] [--meeting-seconds S]
                                   collective algbw/busbw, cleave's and MPI's; overlap; what a
                                   meeting at a small collective costs with cleave's wait and MPI's
  calibrate [--out CLUSTER.toml] [--threads N] [--quick]   measure this machine for the planner:
                                    GEMM table, peaks, memory bandwidth; under mpirun also each
                                    collective's latency and bandwidth per link class
  mesh [CONFIG] --world N [--set parallel.AXIS=D ...] [--ranks-per-host K]
                                    the device mesh's groups (with CONFIG: bytes per axis)
  plan CONFIG.toml --world N [--set key=value ...]   each stage's memory per rank, FLOPs and
                                    bytes per axis per step, predicted from its step programs
  schedule (--pp P --microbatches M --schedule NAME [--virtual V] | --load FILE.csv)
           [--csv OUT] [--trace OUT.json]   check a pipeline schedule (gpipe, 1f1b, interleaved,
                                    zb1p, zbv, or a CSV), print its simulated timeline
Multi-rank: mpirun -np N cleave train CONFIG.toml --set parallel.dp_shard=N ...
)";

}  // namespace

int main(int argc, char** argv) {
  // Before MPI, OpenMP or oneDNN make a thread: each inherits the mask that keeps signals off it.
  cleave::handle_signals_on_own_thread();
  // Started without a launcher (neither mpirun nor srun's PMIx set PMIX_RANK), Open MPI makes the
  // process a singleton: it starts a daemon (orted) beside it, only for MPI_Comm_spawn, which
  // cleave never calls, and tries UCX's and libfabric's transports for peers it cannot have.
  // Isolated, with ob1 over the self transport, a one-process start takes 0.2 s less (a 20-step
  // tiny run 0.49 -> 0.27 s here). Values the user set are kept; other MPIs ignore these.
  if (!std::getenv("PMIX_RANK") && !std::getenv("OMPI_COMM_WORLD_SIZE")) {
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
    setenv("OMPI_MCA_btl", "self", 0);
  }
  int provided = 0;
  // The communication thread makes MPI calls while the main thread computes.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  try {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
      if (rank == 0) std::fputs(kUsage, argc < 2 ? stderr : stdout);
      rc = argc < 2 ? 2 : 0;
    } else {
      // The communication thread calls MPI while the main thread calls it too (groups, agreement).
      if (provided < MPI_THREAD_MULTIPLE)
        throw cleave::EveryRankError("the MPI library provides thread level " +
                                     std::to_string(provided) + ", below MPI_THREAD_MULTIPLE (" +
                                     std::to_string(MPI_THREAD_MULTIPLE) +
                                     "), which cleave's communication thread needs");
      const std::string cmd = argv[1];
      if (world > 1 && cmd != "train" && cmd != "bench-comm" && cmd != "calibrate" &&
          cmd != "generate" && cmd != "serve")
        throw cleave::EveryRankError("cleave " + cmd + " runs on one rank (" +
                                     std::to_string(world) +
                                     " were started); under mpirun use train, generate, "
                                     "serve, bench-comm or calibrate");
      if (cmd == "train") rc = cleave::cli::train(argc - 2, argv + 2);
      else if (cmd == "bench-comm") rc = cleave::cli::bench_comm(argc - 2, argv + 2);
      else if (cmd == "calibrate") rc = cleave::cli::calibrate(argc - 2, argv + 2);
      else if (cmd == "mesh") rc = cleave::cli::mesh(argc - 2, argv + 2);
      else if (cmd == "plan") rc = cleave::cli::plan(argc - 2, argv + 2);
      else if (cmd == "schedule") rc = cleave::cli::schedule(argc - 2, argv + 2);
      else if (cmd == "tokenize") rc = cleave::cli::tokenize(argc - 2, argv + 2);
      else if (cmd == "generate") rc = cleave::cli::generate(argc - 2, argv + 2);
      else if (cmd == "serve") rc = cleave::cli::serve_command(argc - 2, argv + 2);
      else if (cmd == "export") rc = cleave::cli::export_hf(argc - 2, argv + 2);
      else if (cmd == "checkpoint") rc = cleave::cli::checkpoint(argc - 2, argv + 2);
      else if (cmd == "plot") rc = cleave::cli::plot(argc - 2, argv + 2);
      else if (cmd == "import") rc = cleave::cli::import_hf(argc - 2, argv + 2);
      else if (cmd == "bench-gemm") rc = cleave::cli::bench_gemm(argc - 2, argv + 2);
      else if (cmd == "bench-decode") rc = cleave::cli::bench_decode(argc - 2, argv + 2);
      else if (cmd == "peak") rc = cleave::cli::peak(argc - 2, argv + 2);
      else {
        std::fprintf(stderr, "cleave: unknown command '%s'\n%s", cmd.c_str(), kUsage);
        rc = 2;
      }
    }
  } catch (const std::exception& e) {
    rc = cleave::report_error(e);
  }
  cleave::shutdown_comm();
  MPI_Finalize();
  return rc;
}
