#include "cleave/serve/engine.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "cleave/kernels/attention.h"
#include "cleave/kernels/cross_entropy.h"
#include "cleave/model/generate.h"

namespace cleave::serve {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::stop: return "stop";
    case Finish::length: return "length";
    case Finish::cancelled: return "cancelled";
    case Finish::error: return "error";
    case Finish::none: break;
  }
  return "none";
}

float token_logprob(const float* logits, int vocab, int32_t token, std::vector<float>& scratch) {
  scratch.assign(logits, logits + vocab);  // the kernel takes its rows writable
  float loss = 0.0f;
  kernels::cross_entropy_forward_backward(scratch.data(), &loss, &token, 1, vocab, 0.0f);
  return -loss;
}

Engine::Engine(Transformer& model, const EngineOptions& options, Peers* peers)
    : model_(model), options_(options), peers_(peers) {
  CLEAVE_CHECK(options.kv_blocks >= 2, "engine: a pool of " << options.kv_blocks
                                        << " blocks (one holds padding rows, one at least requests)");
  CLEAVE_CHECK(options.max_step_ratio == 0 || options.max_step_ratio >= 1,
               "engine: max_step_ratio " << options.max_step_ratio << " is neither 0 (off) nor >= 1");
  CLEAVE_CHECK(options.step_tokens > 0 && options.max_running > 0,
               "engine: step_tokens " << options.step_tokens << " and max_running "
                                      << options.max_running << " must be positive");
  CLEAVE_CHECK(options.lanes >= 1 && (options.lanes == 1 || peers),
               "engine: " << options.lanes << " lanes (ep ranks), each but the first on other ranks: "
                          << "at least one, and the peers that run them");
  for (int l = 0; l < options.lanes; ++l) {
    // Lane 0 runs here; the others' pools are on their ranks: here, their books alone.
    lanes_.push_back(std::make_unique<Lane>(
        l == 0 ? model.new_pool(options.kv_blocks, kernels::kAttentionKeyBlock, options.kv_dtype)
               : KvPool(0, lanes_[0]->pool.row(), kernels::kAttentionKeyBlock, options.kv_blocks)));
    reserve_tokens(lanes_.back()->pool, lanes_.back()->pad, kRowBucket);
  }
  lanes_[0]->pool.touch_all();
  batches_.resize(size_t(options.lanes));
  lane_tokens_.assign(size_t(options.lanes), 0);
  stats_.blocks = pool_blocks() * options.lanes;
}

int64_t Engine::blocks_for(int64_t tokens) const {
  const int64_t br = kernels::kAttentionKeyBlock;
  return (tokens + br - 1) / br;
}

std::shared_ptr<Request> Engine::submit(std::vector<int32_t> prompt, const Sampling& sampling) {
  CLEAVE_CHECK(!prompt.empty() && int64_t(prompt.size()) < model_.config().max_seq_len,
               "a prompt of " << prompt.size() << " tokens for a model of max_seq_len "
                              << model_.config().max_seq_len);
  Live s;
  s.req = std::make_shared<Request>(prompt, sampling);
  s.prompt = int64_t(prompt.size());
  s.context = std::move(prompt);
  std::shared_ptr<Request> req = s.req;
  {
    std::lock_guard lock(inbox_mu_);
    s.order = next_order_++;
    inbox_.push_back(std::move(s));
    ++stats_.waiting;
  }
  inbox_cv_.notify_one();
  return req;
}

void Engine::wait_for_work(std::chrono::milliseconds wait) {
  std::unique_lock lock(inbox_mu_);
  inbox_cv_.wait_for(lock, wait, [&] { return !inbox_.empty(); });
}

void Engine::release(Live& s, bool keep_prefix) {
  Lane& lane = *lanes_[size_t(s.lane)];
  if (keep_prefix && !s.req->sampling().prompt_logprobs) lane.prefix.insert(s.context, s.cache);
  release_sequence(lane.pool, s.cache);
  s.cache = {};
}

void Engine::end(Live& s, Finish finish, const std::string& why) {
  Event e;
  e.finish = finish, e.error = why;
  s.req->push(std::move(e));
  // A finished request's blocks serve later prefixes; a cancelled or failed one's are dropped.
  release(s, finish == Finish::stop || finish == Finish::length);
}

template <class List>
void Engine::end_all(List& list, Finish finish, const std::string& why, bool only_cancelled) {
  for (auto it = list.begin(); it != list.end();) {
    if (only_cancelled && !it->req->cancelled()) {
      ++it;
      continue;
    }
    end(*it, finish, why);
    it = list.erase(it);
  }
}

void Engine::finish_all(Finish finish, const std::string& why) {
  {
    std::lock_guard lock(inbox_mu_);
    for (Live& s : inbox_) waiting_.push_back(std::move(s));
    inbox_.clear();
  }
  end_all(running_, finish, why, false);
  end_all(waiting_, finish, why, false);
}

// Free blocks for `need` more, giving back cached prefix blocks first; false if that is not enough.
bool Engine::take_blocks(Lane& lane, int64_t need) {
  while (lane.pool.free_blocks() < need)
    if (!lane.prefix.evict_one()) return false;
  return true;
}

void Engine::preempt(size_t i) {
  Live s = std::move(running_[i]);
  running_.erase(running_.begin() + ptrdiff_t(i));
  release(s, true);  // its whole blocks stay cached: the recompute may find them
  s.rows = 0;
  waiting_.push_front(std::move(s));
  ++preempted_;
}

int Engine::choose_lane(Live& s) {
  // One lane has no choice to make: plan() matches the prefix itself.
  const bool reuse = !s.req->sampling().prompt_logprobs && lanes_.size() > 1;
  int best = -1;
  int64_t best_cached = -1;
  for (int l = 0; l < int(lanes_.size()); ++l) {
    Lane& lane = *lanes_[size_t(l)];
    if (lane.budget <= 0 || lane.running >= options_.max_running) continue;
    const int64_t cached = reuse ? lane.prefix.matched(s.context, int64_t(s.context.size()) - 1) : 0;
    if (best < 0 || cached > best_cached ||
        (cached == best_cached && lane.running < lanes_[size_t(best)]->running))
      best = l, best_cached = cached;
  }
  return best;
}

void Engine::plan() {
  std::sort(running_.begin(), running_.end(),
            [](const Live& a, const Live& b) { return a.order < b.order; });
  for (auto& lane : lanes_) lane->budget = options_.step_tokens, lane->running = lane->held = 0;
  for (Live& s : running_) s.rows = 0, ++lanes_[size_t(s.lane)]->running;
  // Running requests, oldest first: a decode token each (a prompt's last token too) first, then
  // the next chunk of each prompt still being prefilled, so that a long prompt never holds up
  // another request's next token.
  for (const bool decodes : {true, false}) {
    if (!decodes) hold_prompt_rows();
    for (size_t i = 0; i < running_.size();) {
      Live& s = running_[i];
      Lane& lane = *lanes_[size_t(s.lane)];
      const int64_t left = int64_t(s.context.size()) - s.cache.length;
      const int64_t n = std::min(left, lane.budget);
      if ((left == 1) != decodes || n <= 0) {
        ++i;
        continue;
      }
      const int64_t need = blocks_for(s.cache.length + n) - int64_t(s.cache.blocks.size());
      if (!take_blocks(lane, need)) {
        // Its lane's newest request gives its blocks back (running_ is oldest first): another,
        // or this one.
        size_t newest = i;
        for (size_t j = i + 1; j < running_.size(); ++j)
          if (running_[j].lane == s.lane) newest = j;
        --lane.running;
        preempt(newest);
        continue;
      }
      reserve_tokens(lane.pool, s.cache, s.cache.length + n);
      s.rows = n;
      lane.budget -= n;
      ++i;
    }
  }
  // Then queued requests, in order, while a lane's budget and pool allow.
  while (!waiting_.empty()) {
    Live& s = waiting_.front();
    const int l = choose_lane(s);
    if (l < 0) break;
    Lane& lane = *lanes_[size_t(l)];
    s.lane = l;
    if (!s.req->sampling().prompt_logprobs) {
      // All but the last token may come from cached blocks: the last must run to give logits.
      s.cache.blocks = lane.prefix.match(s.context, int64_t(s.context.size()) - 1);
      s.cache.length = int64_t(s.cache.blocks.size()) * lane.pool.block_rows();
    }
    const int64_t n = std::min(int64_t(s.context.size()) - s.cache.length, lane.budget);
    if (!take_blocks(lane, blocks_for(s.cache.length + n) - int64_t(s.cache.blocks.size()))) {
      release_sequence(lane.pool, s.cache);  // waits, holding nothing
      s.cache = {};
      break;
    }
    prefix_tokens_ += s.cache.length;
    reserve_tokens(lane.pool, s.cache, s.cache.length + n);
    s.rows = n;
    lane.budget -= n;
    ++lane.running;
    running_.push_back(std::move(s));
    waiting_.pop_front();
  }
  // A step was held where the prompts used up what the ratio left them.
  bool held = false;
  for (const auto& lane : lanes_) held = held || (lane->held > 0 && lane->budget == 0);
  held_steps_ += held;
}

// Row counts beyond kExactRows are padded up to a multiple of kRowBucket by a stand-in sequence
// in its own block: the products keep a primitive per row count (their rows do not depend on the
// count, docs/inference.md), and a server would otherwise make one for nearly every count up to
// step_tokens. The stand-in changes no other row (batch invariance). A lane with nothing to do
// runs one stand-in row: its rank takes part in the experts' all-to-all of the others.
int64_t Engine::padded_rows(int64_t T) {
  return T == 0 ? 1 : T <= kExactRows ? T : (T + kRowBucket - 1) / kRowBucket * kRowBucket;
}

void Engine::pad(const Lane& lane, Batch& b) {
  const int64_t T = int64_t(b.tokens.size());
  const int64_t padded = padded_rows(T);
  if (padded > T) {
    for (int64_t t = 0; t < padded - T; ++t) b.tokens.push_back(0), b.positions.push_back(int32_t(t));
    b.cache_past.push_back(0);
    b.cache_blocks.push_back(lane.pad.blocks);
    b.cache_rows.push_back(padded);
  }
  b.T = padded;
}

int64_t Engine::step_rows_for(int64_t requests) const {
  const auto own = forward_seconds_.find(padded_rows(requests));
  if (options_.max_step_ratio == 0 || own == forward_seconds_.end()) return options_.step_tokens;
  // The rows padding would add cost the step nothing more. Counts are taken in order up to the
  // first that costs too much: a later one timed fast by chance does not let a step skip past it.
  int64_t rows = padded_rows(requests);
  for (auto it = forward_seconds_.upper_bound(rows);
       it != forward_seconds_.end() && it->second <= options_.max_step_ratio * own->second; ++it)
    rows = it->first;
  return std::min(rows, options_.step_tokens);
}

void Engine::hold_prompt_rows() {
  // The step is held to the ratio of one in which every request of the lane decodes, those
  // prefilling and its share of the queue too. Against its decodes alone, the cap would shrink as
  // fewer decode and keep the queue waiting: at 64 clients that cost a fifth of the throughput
  // (docs/performance.md, Serving).
  const int64_t lanes = int64_t(lanes_.size());
  const int64_t queued = (int64_t(waiting_.size()) + lanes - 1) / lanes;
  for (auto& lane : lanes_) {
    const int64_t decodes = options_.step_tokens - lane->budget;
    if (decodes == 0) continue;  // nothing decodes: the prompts have the whole step
    const int64_t requests = std::max(decodes, lane->running + queued);
    // At least kLeastPromptRows, so that prompts keep moving however many decode.
    const int64_t most = std::max(kLeastPromptRows, step_rows_for(requests) - decodes);
    if (most < lane->budget) lane->held = lane->budget - most, lane->budget = most;
  }
}

int64_t Engine::warm_up() {
  const int64_t most = std::min(options_.step_tokens, pool_blocks() * kernels::kAttentionKeyBlock);
  std::vector<int64_t> counts;
  for (int64_t c = 1; c <= std::min(most, kExactRows); ++c) counts.push_back(c);
  for (int64_t c = kExactRows + kRowBucket; c - kRowBucket < most; c += kRowBucket)
    counts.push_back(c);
  std::vector<SequenceCache> seqs(lanes_.size());
  // The first pass makes the primitives; under max_step_ratio the next two time the forwards
  // (the faster of each count's two: a step's own cost, not a moment's disturbance of the
  // machine).
  forward_seconds_.clear();
  const int passes = options_.max_step_ratio > 0 ? 3 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    const bool timed = pass > 0;
    for (const int64_t c : counts) {
      const auto begin = std::chrono::steady_clock::now();
      // A sequence of t tokens, padded to c rows as a step would be; its last rows' logits (as
      // many as a step's decodes usually ask for).
      const int64_t t = std::min(c, most);
      for (size_t l = 0; l < lanes_.size(); ++l) {
        reserve_tokens(lanes_[l]->pool, seqs[l], t);
        Batch& b = batches_[l];
        b.B = 1;
        b.tokens.assign(size_t(t), 0);
        b.positions.resize(size_t(t));
        std::iota(b.positions.begin(), b.positions.end(), 0);
        b.cache_rows = {0, t};
        b.cache_past = {0};
        b.cache_blocks = {seqs[l].blocks};
        b.logit_rows.clear();
        for (int64_t r = t - std::min(t, kExactRows); r < t; ++r) b.logit_rows.push_back(r);
        pad(*lanes_[l], b);
      }
      if (peers_) peers_->send(batches_);
      const float* own = model_.forward_cached(batches_[0], lanes_[0]->pool);
      if (peers_) peers_->gather(own, batches_);
      for (size_t l = 0; l < lanes_.size(); ++l) release_sequence(lanes_[l]->pool, seqs[l]);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      if (timed && (!forward_seconds_.count(c) || seconds < forward_seconds_[c]))
        forward_seconds_[c] = seconds;
    }
  }
  return int64_t(counts.size());
}

// The events of one request after a forward: its prompt tokens' log-probabilities (rows at
// positions before the prompt's last token), then its next token when the rows reached the end
// of its context. `logits` holds this request's logit rows.
void Engine::report(Live& s, const float* logits, int64_t first_position, bool sample) {
  const int V = model_.config().vocab_size;
  const Sampling& o = s.req->sampling();
  auto top = [&](const float* row, int n) {
    std::vector<TokenLogprob> t;
    if (n <= 0) return t;
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    n = std::min(n, V);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return row[a] != row[b] ? row[a] > row[b] : a < b;
    });
    for (int i = 0; i < n; ++i) t.push_back({ids[size_t(i)], token_logprob(row, V, ids[size_t(i)], row_)});
    return t;
  };
  int64_t row = 0;
  if (o.prompt_logprobs && first_position < s.prompt - 1) {
    for (int64_t t = first_position; t < first_position + s.rows; ++t, ++row) {
      if (t + 1 >= s.prompt) break;
      if (t + 1 < s.prompt_logged) continue;  // reported before a preemption
      Event e;
      e.prompt = true;
      e.token = s.context[size_t(t + 1)];
      const float* r = logits + row * V;
      e.logprob = token_logprob(r, V, e.token, row_);
      e.top = top(r, std::max(o.logprobs, 0));
      s.req->push(std::move(e));
      s.prompt_logged = t + 2;
    }
    row = s.rows - 1;
  }
  if (!sample) return;
  const float* r = logits + row * V;
  const float u = token_uniform(o.seed, uint64_t(s.made));
  const int32_t next = sample_token(r, V, o.temperature, o.top_k, u, o.top_p);
  if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next) != o.stop_tokens.end()) {
    s.done = Finish::stop;
    return;
  }
  Event e;
  e.token = next;
  if (o.logprobs >= 0) {
    e.logprob = token_logprob(r, V, next, row_);
    e.top = top(r, o.logprobs);
  }
  s.req->push(std::move(e));
  s.context.push_back(next);
  ++s.made;
  if (s.made >= o.max_tokens || int64_t(s.context.size()) >= model_.config().max_seq_len)
    s.done = Finish::length;
}

bool Engine::step() {
  {
    std::lock_guard lock(inbox_mu_);
    for (Live& s : inbox_) waiting_.push_back(std::move(s));
    inbox_.clear();
  }
  // Requests whose client went away leave first, freeing their blocks.
  end_all(running_, Finish::cancelled, "", true);
  end_all(waiting_, Finish::cancelled, "", true);
  plan();

  // Each lane's batch: its running requests' rows; logits where a prompt's log-probabilities are
  // asked for, and at the last row of a request whose rows reach the end of its context.
  for (Batch& b : batches_) {
    b.B = 1;
    b.tokens.clear(), b.positions.clear(), b.logit_rows.clear();
    b.cache_rows.assign(1, 0);
    b.cache_past.clear(), b.cache_blocks.clear();
  }
  struct Planned {
    Live* s;
    int64_t first_position, first_logit;  // its first logit row within its lane's
    bool sample;
  };
  std::vector<Planned> planned;
  for (Live& s : running_) {
    if (s.rows == 0) continue;
    Batch& b = batches_[size_t(s.lane)];
    const int64_t past = s.cache.length, row0 = int64_t(b.tokens.size());
    for (int64_t t = past; t < past + s.rows; ++t) {
      b.tokens.push_back(s.context[size_t(t)]);
      b.positions.push_back(int32_t(t));
    }
    b.cache_past.push_back(past);
    b.cache_blocks.push_back(s.cache.blocks);
    b.cache_rows.push_back(int64_t(b.tokens.size()));
    const bool sample = past + s.rows == int64_t(s.context.size());
    const Planned p{&s, past, int64_t(b.logit_rows.size()), sample};
    if (s.req->sampling().prompt_logprobs && past < s.prompt - 1) {
      for (int64_t r = row0; r < row0 + s.rows; ++r) b.logit_rows.push_back(r);
    } else if (sample) {
      b.logit_rows.push_back(row0 + s.rows - 1);
    }
    planned.push_back(p);
    s.cache.length = past + s.rows;
  }
  if (planned.empty()) {
    publish();
    return false;
  }
  for (size_t l = 0; l < lanes_.size(); ++l) {
    lane_tokens_[l] += int64_t(batches_[l].tokens.size());
    pad(*lanes_[l], batches_[l]);
  }
  // The step's plan is in the stats before any of its tokens reaches a client.
  publish();
  if (peers_) peers_->send(batches_);
  const float* own = model_.forward_cached(batches_[0], lanes_[0]->pool);
  const float* logits = peers_ ? peers_->gather(own, batches_) : own;
  // Where each lane's logit rows begin among all of them.
  const int V = model_.config().vocab_size;
  std::vector<int64_t> lane_first(lanes_.size(), 0);
  for (size_t l = 1; l < lanes_.size(); ++l)
    lane_first[l] = lane_first[l - 1] + int64_t(batches_[l - 1].logit_rows.size());
  for (const Planned& p : planned)
    report(*p.s, logits + (lane_first[size_t(p.s->lane)] + p.first_logit) * V, p.first_position,
           p.sample);
  ++steps_;
  for (size_t i = 0; i < running_.size();) {
    if (running_[i].done == Finish::none) {
      ++i;
      continue;
    }
    end(running_[i], running_[i].done);
    running_.erase(running_.begin() + ptrdiff_t(i));
  }
  publish();
  return true;
}

void Engine::publish() {
  EngineStats st;
  st.running = int64_t(running_.size());
  st.blocks = pool_blocks() * int64_t(lanes_.size());
  for (const auto& lane : lanes_) {
    st.blocks_used += pool_blocks() - lane->pool.free_blocks();
    for (int32_t b = 0; b < lane->pool.blocks(); ++b) st.blocks_shared += lane->pool.refs(b) > 1;
    st.blocks_cached += lane->prefix.blocks();
  }
  st.preempted = preempted_, st.prefix_tokens = prefix_tokens_, st.steps = steps_;
  st.held_steps = held_steps_;
  st.lane_tokens = lane_tokens_;
  std::lock_guard lock(inbox_mu_);
  st.waiting = int64_t(inbox_.size() + waiting_.size());
  stats_ = st;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(inbox_mu_);
  return stats_;
}

}  // namespace cleave::serve
