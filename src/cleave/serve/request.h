// One generation request as the server's engine (serve/engine.h) runs it, and the channel its
// tokens travel through to the HTTP thread that waits for them: the engine pushes events, the
// HTTP thread pops them, and either side may end the request (the engine when it finishes, the
// client by going away).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace cleave::serve {

struct Sampling {
  int max_tokens = 16;
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  float top_p = 1.0f;
  uint64_t seed = 0;
  // Alternatives reported beside each new token (0: only the chosen token's log-probability);
  // -1: no log-probabilities.
  int logprobs = -1;
  // The log-probability of every prompt token after the first, given those before it (a
  // completion's echo with logprobs). Such a request is prefilled whole, not from shared blocks.
  bool prompt_logprobs = false;
  std::vector<int32_t> stop_tokens;  // producing one ends the request ("stop"); it is not reported
};

enum class Finish { none, stop, length, cancelled, error };
const char* finish_name(Finish f);  // OpenAI's finish_reason: "stop", "length", ...

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// A new token (finish none), or the end of the request. Prompt log-probabilities come first,
// as events with prompt = true, one per prompt token after the first.
struct Event {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // the most likely tokens, most likely first
  bool prompt = false;
  Finish finish = Finish::none;
  std::string error;  // finish error: what went wrong
  std::chrono::steady_clock::time_point at;  // when the engine made it
};

class Request {
 public:
  using Clock = std::chrono::steady_clock;
  Request(std::vector<int32_t> prompt, Sampling sampling)
      : prompt_(std::move(prompt)), sampling_(std::move(sampling)), submitted_(Clock::now()) {}
  const std::vector<int32_t>& prompt() const { return prompt_; }
  const Sampling& sampling() const { return sampling_; }
  Clock::time_point submitted() const { return submitted_; }

  // The HTTP side: the next event, waiting up to `wait`; false when none came.
  bool next(Event& e, std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return false;
    e = std::move(events_.front());
    events_.pop_front();
    return true;
  }
  // The client went away (or the server gives up on it): the engine drops it at its next step and
  // frees its blocks.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // The engine side.
  void push(Event e) {
    e.at = Clock::now();
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }

 private:
  std::vector<int32_t> prompt_;
  Sampling sampling_;
  Clock::time_point submitted_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace cleave::serve
