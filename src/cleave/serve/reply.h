// One request's answer in OpenAI's shape, built from the engine's events (serve/request.h): a
// text_completion or chat.completion body, or, streaming, its server-sent events ending in
// "data: [DONE]". Stop strings end the reply (serve/reply_text.h); usage is in every answer (a
// streamed one carries it in its last chunk, and in OpenAI's separate usage chunk when
// stream_options.include_usage asks for it).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cleave/data/tokenizer.h"
#include "cleave/serve/reply_text.h"
#include "cleave/serve/request.h"

namespace cleave::serve {

enum class Endpoint { completions, chat };

struct ReplySetup {
  Endpoint endpoint = Endpoint::completions;
  std::string id, model;
  int64_t created = 0;
  bool stream = false, include_usage = false;
  int logprobs = -1;  // alternatives per token, -1 none (RequestCommon)
  bool echo = false;  // completions: the prompt's text (and log-probabilities) first
  std::vector<int32_t> prompt;
  std::vector<std::string> stop;
};

class Reply {
 public:
  Reply(const Tokenizer& tokenizer, ReplySetup setup);
  // Takes the engine's next event; returns the server-sent events to send now (streaming).
  // Returns true in `ended` once the reply is complete (a stop string may end it before the
  // engine does: the caller then cancels the request).
  std::string take(const Event& e, bool& ended);
  // The last events of a stream (the usage chunk when asked for, then [DONE]).
  std::string stream_end() const;
  // The whole body (not streaming), once ended.
  std::string body() const;
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  int64_t completion_tokens() const { return made_; }

 private:
  nlohmann::json chunk(const std::string& text, const nlohmann::json& logprobs,
                       const char* finish) const;
  nlohmann::json usage() const;
  void token_entry(int32_t token, float logprob, const std::vector<TokenLogprob>& top,
                             bool has_logprob);
  std::string token_text(int32_t id) const;

  const Tokenizer& tok_;
  ReplySetup s_;
  ReplyText text_;
  std::string shown_;    // what a whole body answers with (echo's prompt first)
  nlohmann::json lp_;    // the log-probabilities so far (the endpoint's shape)
  nlohmann::json step_lp_;  // those not streamed yet
  int64_t made_ = 0, offset_ = 0;
  bool first_chunk_ = true;
  std::string finish_, error_;
};

}  // namespace cleave::serve
