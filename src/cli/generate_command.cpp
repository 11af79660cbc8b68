// cleave generate: a checkpoint of any training layout, loaded into the inference layout the
// ranks make (tp x pp x ep, docs/inference.md), continues a prompt.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <mpi.h>
#include <omp.h>

#include "cleave/base/host_memory.h"
#include "cleave/checkpoint/load_model.h"
#include "cleave/comm/errors.h"
#include "cleave/data/tokenizer.h"
#include "cleave/model/generate.h"
#include "cleave/parallel/inference_layout.h"
#include "cleave/parallel/process_groups.h"
#include "cli/args.h"
#include "cli/carried_tokenizer.h"

namespace cleave::cli {

namespace {

struct Degrees {
  int tp = 1, pp = 1, ep = 1;
};

Degrees inference_degrees(const Args& a) {
  Degrees d;
  for (const std::string& kv : a.overrides) {
    const size_t eq = kv.find('=');
    const std::string key = kv.substr(0, eq);
    int* at = key == "parallel.tp" ? &d.tp : key == "parallel.pp" ? &d.pp
            : key == "parallel.ep" ? &d.ep : nullptr;
    if (!at || eq == std::string::npos)
      throw Error("cleave generate: --set " + kv +
                  ": the inference layout takes parallel.tp=N, parallel.pp=N and parallel.ep=N");
    *at = int(parse_integer(kv.substr(eq + 1), key, 1, 4096));
  }
  return d;
}

// Each prompt's tokens from the ep rank that generated it (prompt i on rank i % ep) to all.
void share_outputs(std::vector<std::vector<int32_t>>& out, Group* ep) {
  if (!ep) return;
  for (size_t i = 0; i < out.size(); ++i) {
    const int owner = int(i % size_t(ep->size()));
    int64_t n = int64_t(out[i].size());
    MPI_Bcast(&n, 1, MPI_INT64_T, owner, ep->comm());
    out[i].resize(size_t(n));
    MPI_Bcast(out[i].data(), int(n), MPI_INT32_T, owner, ep->comm());
  }
}

}  // namespace

int generate(int argc, char** argv) {
  const Args a = Args::parse("generate", argc, argv,
                             {"--prompt", "--prompt-ids", "--max-new-tokens", "--temperature",
                              "--top-k", "--seed", "--tokenizer", "--threads", "--dtype",
                              "--prefill-chunk", "--batch", "--kv-cache-mib", "--kv-cache-dtype"},
                             {"--ids", "--warmup"});
  if (a.positional.size() != 1) throw Error("cleave generate: expected one CHECKPOINT_DIR");
  if (a.has("--prompt") == a.has("--prompt-ids"))
    throw Error("cleave generate: give the prompt as --prompt TEXT or as --prompt-ids \"ID ID ...\"");
  if (a.has("--threads")) omp_set_num_threads(int(a.integer("--threads", 1, 1, 4096)));
  const std::string dtype = a.get("--dtype", "fp32");
  if (dtype != "fp32" && dtype != "bf16")
    throw Error("cleave generate: --dtype must be fp32 or bf16, not '" + dtype + "'");
  SamplingOptions o;
  o.temperature = float(a.number_in("--temperature", 0.8, 0.0, 1e4));
  o.top_k = int(a.integer("--top-k", 40, 0, INT32_MAX));  // 0: every token
  o.seed = uint64_t(a.integer("--seed", 0, 0, INT64_MAX));
  o.prefill_chunk = a.integer("--prefill-chunk", 0, 0, INT64_MAX);
  o.kv_cache_mib = a.number_in("--kv-cache-mib", 0, 0, 1e9);
  // auto: the weights' dtype, as vLLM's --kv-cache-dtype auto.
  o.kv_dtype = parse_kv_dtype(a.get("--kv-cache-dtype", "auto"), dtype, "cleave generate: --kv-cache-dtype");
  {  // the ranks on this host share its memory
    MPI_Comm host;
    int on_host = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &on_host);
    MPI_Comm_free(&host);
    o.memory_bytes = host_memory_bytes() / on_host;
  }
  const int64_t copies = a.integer("--batch", 1, 1, 4096);
  const Degrees deg = inference_degrees(a);
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  const ModelCheckpoint opened = open_model_checkpoint(a.positional[0]);
  InferenceLayout layout = plan_inference(opened.model, deg.tp, deg.pp, deg.ep, world);
  init_comm(CommOptions{});
  ProcessGroups groups = make_process_groups(layout.mesh, rank, opened.model,
                                             looped_stages(deg.pp, 1));
  TensorParallelOptions tp_options;
  if (groups.tp_comm) tp_options.comm = groups.tp_comm.get();
  const LoadedModel loaded =
      load_model(opened, dtype == "bf16" ? Precision::bf16 : Precision::fp32, tp_options,
                 {layout.chunk(groups.pp->rank())}, groups.ep_comm.get());
  Transformer& model = *loaded.model;
  GroupStageLink stage_link(*groups.pp);
  if (deg.pp > 1) model.set_stage_link(&stage_link);
  Group* ep = deg.ep > 1 ? groups.along({"ep"}) : nullptr;
  PromptShare share;
  if (ep) {
    share.rank = ep->rank(), share.size = ep->size();
    share.any = [ep](bool mine) {
      float x = mine ? 1.0f : 0.0f;
      ep->all_reduce(&x, 1, CommType::f32).wait();
      return x > 0;
    };
  }

  const int vocab = model.config().vocab_size;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> prompt;
  if (a.has("--prompt-ids")) {  // token ids: no tokenizer needed
    std::istringstream ids(a.get("--prompt-ids", ""));
    for (std::string id; ids >> id;)
      prompt.push_back(int32_t(parse_integer(id, "--prompt-ids", 0, vocab - 1)));
    if (prompt.empty()) throw Error("cleave generate: --prompt-ids holds no token id");
  } else {
    const std::string tokenizer_path = a.get("--tokenizer", carried_tokenizer(loaded));
    if (tokenizer_path.empty())
      throw Error("cleave generate: no tokenizer: neither the checkpoint " + loaded.dir +
                  " nor the data folder " + loaded.data_dir +
                  " holds a tokenizer.model or tokenizer.json; give one with --tokenizer");
    tokenizer = open_tokenizer(tokenizer_path);
    if (rank == 0)
      std::cerr << "# tokenizer: " << tokenizer->path() << " (" << tokenizer->kind()
                << ", vocabulary " << tokenizer->vocab_size() << ")" << std::endl;
    if (tokenizer->vocab_size() != vocab)
      throw Error("tokenizer " + tokenizer->path() + " has " +
                  std::to_string(tokenizer->vocab_size()) + " tokens but the model's vocab_size is " +
                  std::to_string(vocab));
    for (uint32_t id : tokenizer->encode(a.get("--prompt", ""))) prompt.push_back(int32_t(id));
    o.stop_token = tokenizer->eos_id();
  }
  // The prompt and what follows it fit the model's context.
  const int64_t room = model.config().max_seq_len - int64_t(prompt.size());
  if (room < 1)
    throw Error("cleave generate: the prompt is " + std::to_string(prompt.size()) +
                " tokens, which leaves no room in the model's max_seq_len of " +
                std::to_string(model.config().max_seq_len));
  o.max_new_tokens = int(a.integer("--max-new-tokens", std::min<int64_t>(100, room), 0, room));
  std::ostringstream cache;
  cache << kv_dtype_name(o.kv_dtype) << ", ";
  if (o.kv_cache_mib > 0) cache << o.kv_cache_mib << " MiB a rank";
  else cache << "as needed";
  if (rank == 0)
    std::cerr << "# generate: " << dtype << " weights, " << omp_get_max_threads() << " threads, "
              << copies << " sequence" << (copies > 1 ? "s" : "") << " of a " << prompt.size()
              << "-token prompt, tp " << deg.tp << ", pp " << deg.pp << ", ep " << deg.ep
              << ", prefill "
              << (o.prefill_chunk > 0 ? "in chunks of " + std::to_string(o.prefill_chunk) : "whole")
              << ", key/value cache " << cache.str() << std::endl;
  const std::vector<std::vector<int32_t>> prompts(size_t(copies), prompt);
  // --warmup: the weights' packed copies and the products' primitives for these row counts are
  // made by an untimed run first, as a server makes them before its first request.
  if (a.has("--warmup")) {
    SamplingOptions once = o;
    once.max_new_tokens = std::min(o.max_new_tokens, 2);
    generate_batch(model, prompts, once, {}, share);
  }

  // Every rank computes the tokens (each ep rank those of its prompts); rank 0 prints them. One
  // sequence's text is printed as it comes; several are printed at the end, one a line.
  std::ostringstream discard;
  std::ostream& out = rank == 0 ? std::cout : discard;
  const bool ids = a.has("--ids") || !tokenizer;
  std::optional<DecodeStream> stream;
  if (!ids && copies == 1) stream.emplace(*tokenizer);
  // Prefill ends with the first token drawn; the rest is decoding, one forward a step.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point first;
  int64_t drawn = 0;
  const auto on_token = [&](int32_t t) {
    if (drawn++ == 0) {
      first = Clock::now();
      if (stream) out << a.get("--prompt", "");  // once the request is known to run
    }
    if (stream && t != o.stop_token) out << stream->next(uint32_t(t)) << std::flush;
  };
  std::vector<std::vector<int32_t>> tokens = generate_batch(model, prompts, o, on_token, share);
  const Clock::time_point end = Clock::now();
  share_outputs(tokens, ep);
  if (stream) {
    if (drawn == 0) out << a.get("--prompt", "");
    out << stream->finish() << "\n";
  } else {
    for (const std::vector<int32_t>& seq : tokens) {
      if (ids) {
        for (int32_t t : prompt) out << t << " ";
        out << "|";
        for (int32_t t : seq) out << " " << t;
      } else {
        DecodeStream text(*tokenizer);
        out << a.get("--prompt", "");
        for (int32_t t : seq)
          if (t != o.stop_token) out << text.next(uint32_t(t));
        out << text.finish();
      }
      out << "\n";
    }
  }
  out << std::flush;
  // This rank's tokens: with ep, rank 0's share of the prompts.
  const double prefill_s = std::chrono::duration<double>(first - start).count();
  const double decode_s = std::chrono::duration<double>(end - first).count();
  const int64_t mine = (copies + share.size - 1 - share.rank) / share.size;
  const int64_t decoded = drawn - mine;  // the first token of each sequence ends its prefill
  if (drawn > 0 && rank == 0)
    std::fprintf(stderr, "# prefill: %lld tokens in %.1f ms (%.1f tokens/s); decode: %lld tokens "
                         "in %.1f ms (%.1f tokens/s)\n",
                 (long long)(mine * int64_t(prompt.size())), prefill_s * 1e3,
                 double(mine * int64_t(prompt.size())) / prefill_s, (long long)decoded,
                 decode_s * 1e3, decoded > 0 ? double(decoded) / decode_s : 0.0);
  return 0;
}

}  // namespace cleave::cli
