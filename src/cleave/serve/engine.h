// The server's engine (docs/serving.md): continuous batching over the inference forward
// (Transformer::forward_cached). Each step is one ragged batch: every running request's next
// token, then prompt chunks, within a token budget, so a long prompt is prefilled over several
// steps while the others keep decoding. A request joins at the next step and leaves when it ends.
// The key/value pool has a fixed size: requests wait in the queue while it is full; a running
// request that needs a block when none is free is preempted, the newest first, back to the head
// of the queue, and recomputes its cache when it resumes. Whole blocks of finished and preempted
// requests stay cached for requests that begin with the same tokens (serve/prefix_cache.h).
// Under ep the engine has a lane per ep rank: each lane's requests run on that rank, over its own
// pool, in a batch of their own (serve/step_peers.h); the engine keeps every lane's books.
//
// A request's tokens and log-probabilities do not depend on the rest of the batch: the forward is
// batch invariant (docs/inference.md), and its draws use Philox keyed by (its seed, token index),
// as `cleave generate` does, so preemption and prefix sharing change nothing either.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cleave/kernels/linear.h"
#include "cleave/model/transformer.h"
#include "cleave/serve/prefix_cache.h"
#include "cleave/serve/request.h"

namespace cleave::serve {

struct EngineOptions {
  int64_t kv_blocks = 0;      // a lane's pool's blocks (of kernels::kAttentionKeyBlock tokens), >= 2
  int64_t step_tokens = 128;  // tokens in a lane's forward at most (prompt chunks fill what decodes leave)
  int64_t max_running = 256;  // requests in a lane's running batch at most
  // A step that carries prompt rows beside decodes may take at most this many times the forward
  // of its decodes alone, by the forward's time per row count that warm_up measures (Sarathi-
  // Serve's stall-free chunks, as a ratio): the decoding requests' per-token latency stays within
  // it while prompts arrive. 0: prompts fill the whole step_tokens.
  double max_step_ratio = 2;
  int lanes = 1;              // the ep ranks, each serving requests of its own
  KvDtype kv_dtype = KvDtype::fp32;  // the pool's keys and values
};

// The other ranks of the layout, as the engine sees them (serve/step_peers.h has MPI's).
class Peers {
 public:
  virtual ~Peers() = default;
  // Before a step runs here: every lane's batch (this rank runs lane 0's).
  virtual void send(const std::vector<Batch>& lanes) = 0;
  // After: every lane's logit rows, lane by lane, lane 0's (`own`, this rank's) among them.
  virtual const float* gather(const float* own, const std::vector<Batch>& lanes) = 0;
};

// What the server reports (GET /metrics): a snapshot taken between steps.
struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t blocks = 0, blocks_used = 0, blocks_shared = 0, blocks_cached = 0;
  int64_t preempted = 0;      // preemptions so far
  int64_t held_steps = 0;     // steps that left prompt rows for later by max_step_ratio
  int64_t prefix_tokens = 0;  // prompt tokens taken from cached blocks instead of computed
  int64_t steps = 0;
  std::vector<int64_t> lane_tokens;  // tokens each lane computed (padding not counted)
};

class Engine {
 public:
  // `peers` (needed with more than one lane) get every step's batches before this rank runs
  // lane 0's: the other ranks of the inference layout run them (serve/step_peers.h).
  Engine(Transformer& model, const EngineOptions& options, Peers* peers = nullptr);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Blocks a request of this many tokens (prompt and new) needs at most: more than a lane's pool's
  // is a request the server refuses.
  int64_t blocks_for(int64_t tokens) const;
  int64_t pool_blocks() const { return lanes_[0]->pool.blocks() - 1; }  // one holds padding rows

  // Runs one forward at each row count a step can have (each lane's, on every rank), so that the
  // products make their primitives for them now (docs/inference.md: one per row count, about a
  // millisecond per linear) rather than in the first requests' steps; then, under
  // max_step_ratio, each twice more, timed (forward_seconds). Returns the counts.
  int64_t warm_up();
  // The forward's seconds per row count (a step's padded count), as warm_up measured them.
  const std::map<int64_t, double>& forward_seconds() const { return forward_seconds_; }
  void set_forward_seconds(std::map<int64_t, double> seconds) { forward_seconds_ = std::move(seconds); }
  // The rows a step may have under max_step_ratio with `requests` requests in its lane: its
  // forward within the ratio of one in which each of them decodes a token (step_tokens without
  // a ratio or timings).
  int64_t step_rows_for(int64_t requests) const;

  // The prompt rows max_step_ratio leaves a step at the least: a prompt among many decodes would
  // otherwise move a row a step (a 1,000-token prompt in 1,000 steps).
  static constexpr int64_t kLeastPromptRows = 8;

  // Thread-safe: queues a request for the next step.
  std::shared_ptr<Request> submit(std::vector<int32_t> prompt, const Sampling& sampling);
  // One step; false when there was nothing to do (no request running or waiting).
  bool step();
  // Waits until a request is submitted, at most `wait` (an idle server's loop).
  void wait_for_work(std::chrono::milliseconds wait);
  // Ends every request still queued or running with `finish` (a server shutting down).
  void finish_all(Finish finish, const std::string& why);
  EngineStats stats() const;  // thread-safe

 private:
  struct Live {
    std::shared_ptr<Request> req;
    std::vector<int32_t> context;  // prompt, then the new tokens
    int64_t prompt = 0, made = 0;  // prompt tokens; new tokens reported
    uint64_t order = 0;            // arrival: the newest is preempted first
    SequenceCache cache;
    int lane = 0;               // while running
    int64_t rows = 0;           // this step's new rows
    int64_t prompt_logged = 0;  // prompt tokens whose log-probabilities went out (Sampling)
    Finish done = Finish::none;
  };
  // One ep rank's share: its pool's books (the pool itself on rank 0, lane 0), its cached
  // prefixes and the block of its stand-in rows.
  struct Lane {
    explicit Lane(KvPool p) : pool(std::move(p)), prefix(pool) {}
    KvPool pool;
    PrefixCache prefix;
    SequenceCache pad;
    int64_t budget = 0, running = 0;  // this step's tokens left, its running requests
    int64_t held = 0;  // this step's tokens max_step_ratio took from the prompts' budget
  };
  bool take_blocks(Lane& lane, int64_t need);
  void preempt(size_t running_index);
  void release(Live& s, bool keep_prefix);
  // The lane a queued request joins (-1: none has room this step): the one that holds the most
  // of its prompt's blocks, then the one running the fewest requests.
  int choose_lane(Live& s);
  void plan();
  void pad(const Lane& lane, Batch& batch);
  // A step's row count as the forward runs it (pad).
  static int64_t padded_rows(int64_t rows);
  // Cuts each lane's budget for prompt rows to what max_step_ratio allows beside its decodes.
  // Runs after the decodes have taken their rows, before the queue is admitted.
  void hold_prompt_rows();
  void report(Live& s, const float* logits, int64_t first_position, bool sample);
  void end(Live& s, Finish finish, const std::string& why = "");
  // Ends each request of the list (only the cancelled ones when asked) and drops it.
  template <class List>
  void end_all(List& list, Finish finish, const std::string& why, bool only_cancelled);
  void publish();  // stats_ from this step's state

  // Steps' row counts (step()): exact up to kExactRows, then whole row tiles of the products,
  // buckets fine enough for max_step_ratio to stop between 32 and 64 rows.
  static constexpr int64_t kExactRows = 32, kRowBucket = kInvariantRowTile;
  Transformer& model_;
  EngineOptions options_;
  Peers* peers_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  mutable std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::deque<Live> inbox_;
  std::deque<Live> waiting_;
  std::vector<Live> running_;
  uint64_t next_order_ = 0;
  EngineStats stats_;  // guarded by inbox_mu_ once published
  int64_t preempted_ = 0, prefix_tokens_ = 0, steps_ = 0, held_steps_ = 0;
  std::map<int64_t, double> forward_seconds_;
  std::vector<int64_t> lane_tokens_;
  std::vector<Batch> batches_;  // this step's, a lane each
  std::vector<float> row_;  // one row of logits, for the log-probability kernel
};

// log p(token | row) for a row of logits: what the trainer's loss would be for that target,
// negated (kernels::cross_entropy_forward_backward), so that in fp32 it equals the trainer's.
float token_logprob(const float* logits, int vocab, int32_t token, std::vector<float>& scratch);

}  // namespace cleave::serve
