// cleave serve: an OpenAI-compatible server (docs/serving.md) over a checkpoint of any training
// layout, on one process or under mpirun in a tp x pp x ep inference layout. Rank 0 owns the
// socket and the scheduler; every step's ragged batches go from it to the other ranks.
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include <mpi.h>
#include <omp.h>

#include "cleave/base/host_memory.h"
#include "cleave/checkpoint/load_model.h"
#include "cleave/comm/errors.h"
#include "cleave/comm/group.h"
#include "cleave/parallel/inference_layout.h"
#include "cleave/parallel/process_groups.h"
#include "cleave/serve/http_server.h"
#include "cleave/serve/step_peers.h"
#include "cli/args.h"
#include "cli/carried_tokenizer.h"

namespace cleave::cli {

namespace {

std::atomic<bool> interrupted{false};
extern "C" void on_interrupt(int) { interrupted = true; }

struct ServeSettings {
  int tp = 1, pp = 1, ep = 1;
  double kv_cache_mb = 512;
  std::string kv_cache_dtype = "auto";  // the weights' dtype, as vLLM's --kv-cache-dtype auto
  // The engine's defaults, said once (serve/engine.h).
  int64_t step_tokens = serve::EngineOptions{}.step_tokens, max_running = serve::EngineOptions{}.max_running;
  double max_step_ratio = serve::EngineOptions{}.max_step_ratio;
  int64_t max_body_bytes = 1 << 20, http_threads = 128;
  double drain_seconds = 30;
  double comm_timeout_s = CommOptions{}.timeout_seconds;  // the training key's, and its default
};

ServeSettings serve_settings(const Args& a) {
  ServeSettings s;
  for (const std::string& kv : a.overrides) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq), value = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (eq == std::string::npos)
      throw Error("cleave serve: --set " + kv + " is not key=value");
    if (key == "parallel.tp") s.tp = int(parse_integer(value, key, 1, 4096));
    else if (key == "parallel.pp") s.pp = int(parse_integer(value, key, 1, 4096));
    else if (key == "parallel.ep") s.ep = int(parse_integer(value, key, 1, 4096));
    else if (key == "serve.kv_cache_mb") s.kv_cache_mb = parse_number_in(value, key, 1e-3, 1e9);
    else if (key == "serve.kv_cache_dtype") {
      parse_kv_dtype(value, "fp32", "cleave serve: --set serve.kv_cache_dtype");  // checked now
      s.kv_cache_dtype = value;
    }
    else if (key == "serve.step_tokens") s.step_tokens = parse_integer(value, key, 1, int64_t(1) << 20);
    else if (key == "serve.max_running") s.max_running = parse_integer(value, key, 1, 1 << 16);
    else if (key == "serve.max_step_ratio") {
      s.max_step_ratio = parse_number_in(value, key, 0, 1e6);
      if (s.max_step_ratio > 0 && s.max_step_ratio < 1)
        throw Error("cleave serve: --set serve.max_step_ratio=" + value +
                    ": a step cannot take less than its decodes alone; give 0 (off) or a ratio >= 1");
    }
    else if (key == "serve.max_body_bytes") s.max_body_bytes = parse_integer(value, key, 1024, int64_t(1) << 34);
    else if (key == "serve.http_threads") s.http_threads = parse_integer(value, key, 1, 4096);
    else if (key == "serve.drain_seconds") s.drain_seconds = double(parse_integer(value, key, 0, 86400));
    else if (key == "parallel.comm_timeout_s") s.comm_timeout_s = parse_number_in(value, key, 0.1, 1e7);
    else
      throw Error("cleave serve: --set " + kv + ": the server takes parallel.tp, parallel.pp, parallel.ep, "
                  "parallel.comm_timeout_s and "
                  "serve.{kv_cache_mb, kv_cache_dtype, step_tokens, max_step_ratio, max_running, max_body_bytes, "
                  "http_threads, drain_seconds}");
  }
  return s;
}

serve::ChatTemplate chat_template(const std::string& option, const Tokenizer& tok, std::string& why) {
  if (option == "chatml") return why = "--chat-template", serve::ChatTemplate::chatml;
  if (option == "llama3") return why = "--chat-template", serve::ChatTemplate::llama3;
  if (option == "llama2") return why = "--chat-template", serve::ChatTemplate::llama2;
  if (option != "auto")
    throw Error("cleave serve: --chat-template must be auto, chatml, llama3 or llama2, not '" + option + "'");
  if (tok.chat_template().empty()) return why = "the default: the tokenizer names none", serve::ChatTemplate::chatml;
  if (const auto t = serve::recognize_template(tok.chat_template()))
    return why = "the tokenizer's chat_template", *t;
  why = "the default: the tokenizer's chat_template is not one cleave knows";
  return serve::ChatTemplate::chatml;
}

}  // namespace

int serve_command(int argc, char** argv) {
  const Args a = Args::parse("serve", argc, argv,
                             {"--host", "--port", "--api-key", "--model-name", "--dtype", "--threads",
                              "--tokenizer", "--chat-template"},
                             {});
  if (a.positional.size() != 1) throw Error("cleave serve: expected one CHECKPOINT_DIR");
  if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 1, 1, 4096)));
  const std::string dtype = a.get("--dtype", "fp32");
  if (dtype != "fp32" && dtype != "bf16")
    throw Error("cleave serve: --dtype must be fp32 or bf16, not '" + dtype + "'");
  const ServeSettings set = serve_settings(a);
  // glibc gives each new thread that allocates an arena of its own, up to 8 per core: as more of
  // the HTTP threads take their first request, RSS kept rising under a steady load (52 -> 56
  // MiB over one load test of the tiny model). A few arenas keep it at its level.
  mallopt(M_ARENA_MAX, 4);
  serve::ServerOptions so;
  so.host = a.get("--host", "127.0.0.1");
  so.port = int(a.integer("--port", 8000, 0, 65535));
  const char* env_key = std::getenv("CLEAVE_API_KEY");
  so.api_key = a.get("--api-key", env_key ? env_key : "");
  so.max_body_bytes = set.max_body_bytes;
  so.threads = int(set.http_threads);
  so.drain_seconds = set.drain_seconds;
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  const std::string dir = a.positional[0];
  const ModelCheckpoint opened = open_model_checkpoint(dir);
  InferenceLayout layout = plan_inference(opened.model, set.tp, set.pp, set.ep, world);
  CommOptions comm_options;
  comm_options.timeout_seconds = set.comm_timeout_s;
  init_comm(comm_options);
  // mpirun passes SIGTERM (and Ctrl-C's SIGINT) to every rank: rank 0 drains and then tells the
  // others to stop, so theirs change nothing.
  sigterm_is_a_request("the server drains: new requests get 503, running ones finish, then it exits");
  std::signal(SIGINT, rank == 0 ? on_interrupt : SIG_IGN);
  ProcessGroups groups = make_process_groups(layout.mesh, rank, opened.model, looped_stages(set.pp, 1));
  TensorParallelOptions tp_options;
  if (groups.tp_comm) tp_options.comm = groups.tp_comm.get();
  const LoadedModel loaded = load_model(opened, dtype == "bf16" ? Precision::bf16 : Precision::fp32,
                                        tp_options, {layout.chunk(groups.pp->rank())},
                                        groups.ep_comm.get());
  Transformer& model = *loaded.model;
  GroupStageLink stage_link(*groups.pp);
  if (set.pp > 1) model.set_stage_link(&stage_link);
  serve::PeerGroups peer_groups;
  peer_groups.world = MPI_COMM_WORLD;
  peer_groups.steps = groups.world.get();
  peer_groups.vocab = model.config().vocab_size;
  peer_groups.timeout_seconds = set.comm_timeout_s;
  if (set.ep > 1) {
    peer_groups.ep = groups.along({"ep"});
    // Rank 0's ep group holds every lane's logits whole (tp gathers them, the last stage shares
    // them with the first): its members send theirs to rank 0.
    peer_groups.gathers = groups.tp->rank() == 0 && groups.pp->rank() == 0;
  }

  // Every rank's pool has the same blocks: as many as the smallest share of kv_cache_mb holds.
  const KvDtype kv_dtype = parse_kv_dtype(set.kv_cache_dtype, dtype, "cleave serve: serve.kv_cache_dtype");
  const double block_bytes = double(kernels::kAttentionKeyBlock) * double(model.kv_bytes_per_token(kv_dtype));
  int64_t blocks = int64_t(set.kv_cache_mb * (1 << 20) / block_bytes);
  MPI_Allreduce(MPI_IN_PLACE, &blocks, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  std::ostringstream mb;
  mb << set.kv_cache_mb;
  if (blocks < 2)
    throw EveryRankError("cleave serve: serve.kv_cache_mb=" + mb.str() +
                         " holds fewer than 2 blocks of " + std::to_string(kernels::kAttentionKeyBlock) + " tokens (" +
                         std::to_string(block_bytes / (1 << 20)) + " MiB each)");
  if (double(blocks) * block_bytes > double(host_memory_bytes()))
    throw EveryRankError("cleave serve: serve.kv_cache_mb=" + mb.str() + " is more than this host's memory");
  if (rank != 0) {
    // Rank 0 says whether it could start (a port in use, no tokenizer) before any step comes.
    int started = 0;
    MPI_Bcast(&started, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!started) throw Error("cleave serve: rank 0 could not start the server (its message says why)");
    serve::follow_steps(model, blocks, kv_dtype, peer_groups);
    return 0;
  }
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<serve::MpiPeers> peers;
  std::unique_ptr<serve::Engine> engine;
  std::unique_ptr<serve::HttpServer> server;
  std::string template_why;
  int port = 0, started = 0;
  try {
    const std::string tokenizer_path = a.get("--tokenizer", carried_tokenizer(loaded));
    if (tokenizer_path.empty())
      throw Error("cleave serve: no tokenizer: neither the checkpoint " + loaded.dir + " nor the data folder " +
                  loaded.data_dir + " holds a tokenizer.model or tokenizer.json; give one with --tokenizer");
    tok = open_tokenizer(tokenizer_path);
    if (tok->vocab_size() > model.config().vocab_size)
      throw Error("cleave serve: tokenizer " + tok->path() + " has " + std::to_string(tok->vocab_size()) +
                  " tokens, more than the model's vocab_size of " + std::to_string(model.config().vocab_size));
    so.chat = chat_template(a.get("--chat-template", "auto"), *tok, template_why);
    std::string name = std::filesystem::path(dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
    so.model_name = a.get("--model-name", name);
    serve::EngineOptions eo;
    eo.kv_blocks = blocks, eo.step_tokens = set.step_tokens, eo.max_running = set.max_running;
    eo.max_step_ratio = set.max_step_ratio;
    eo.kv_dtype = kv_dtype;
    eo.lanes = set.ep;
    if (world > 1) peers = std::make_unique<serve::MpiPeers>(peer_groups);
    engine = std::make_unique<serve::Engine>(model, eo, peers.get());
    server = std::make_unique<serve::HttpServer>(*engine, *tok, model.config(), so);
    port = server->bind();
    started = 1;
  } catch (...) {
    if (world > 1) MPI_Bcast(&started, 1, MPI_INT, 0, MPI_COMM_WORLD);
    throw;
  }
  if (world > 1) MPI_Bcast(&started, 1, MPI_INT, 0, MPI_COMM_WORLD);
  // After the other ranks heard that it started: they run the warm-up's steps too.
  const auto warm_begin = std::chrono::steady_clock::now();
  const int64_t warmed = engine->warm_up();
  const double warm_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_begin).count();
  std::cerr << "# serve: model '" << so.model_name << "' from " << dir << ", " << dtype << " weights, "
            << omp_get_max_threads() << " threads, tp " << set.tp << ", pp " << set.pp << ", ep " << set.ep;
  if (set.ep > 1) std::cerr << " (each ep rank serves requests of its own)";
  std::cerr << "\n"
            << "# serve: key/value cache " << blocks << " blocks of " << kernels::kAttentionKeyBlock
            << " tokens, " << kv_dtype_name(kv_dtype) << " (serve.kv_cache_dtype=" << set.kv_cache_dtype << "; "
            << double(blocks) * block_bytes / (1 << 20) << " MiB a rank, serve.kv_cache_mb="
            << set.kv_cache_mb << "), steps of at most " << set.step_tokens << " tokens, at most "
            << set.max_running << " requests running";
  if (world > 1) std::cerr << "; collectives and step transfers time out after " << set.comm_timeout_s << " s";
  std::cerr << "\n"
            << "# serve: tokenizer " << tok->path() << "; chat template " << serve::template_name(so.chat)
            << " (" << template_why << "); bodies up to " << so.max_body_bytes << " bytes\n"
            << "# serve: the forward warmed up at " << warmed << " row counts in " << warm_seconds << " s\n";
  if (set.max_step_ratio > 0) {
    // The timings the prompt rows are held by, at a few counts.
    const std::map<int64_t, double>& t = engine->forward_seconds();
    std::cerr << "# serve: a step with prompt rows takes at most " << set.max_step_ratio
              << "x the forward of one in which every request decodes (serve.max_step_ratio); "
                 "forwards measured:";
    for (const int64_t rows : {int64_t(1), int64_t(16), int64_t(32), set.step_tokens})
      if (auto it = t.lower_bound(rows); it != t.end())
        std::cerr << " " << it->first << " rows " << 1e3 * it->second << " ms;";
    std::cerr << " so 1 request takes up to " << engine->step_rows_for(1) << " rows, 16 requests "
              << engine->step_rows_for(16) << "\n";
  } else {
    std::cerr << "# serve: prompt rows fill every step to serve.step_tokens (serve.max_step_ratio=0)\n";
  }
  if (so.api_key.empty())
    std::cerr << "# serve: OPEN: no API key is asked for (--api-key or CLEAVE_API_KEY sets one); "
              << "anyone who can reach " << so.host << ":" << port << " may use it\n";
  else
    std::cerr << "# serve: requests must carry 'Authorization: Bearer <the API key>'\n";
  std::cerr << "# serve: listening on http://" << so.host << ":" << port << " (pid " << getpid()
            << ")" << std::endl;
  server->run([] { return interrupted.load() || sigterm_received(); });
  if (peers) peers->stop();
  std::cerr << "# serve: drained, exiting" << std::endl;
  return 0;
}

}  // namespace cleave::cli
