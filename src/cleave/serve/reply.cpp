#include "cleave/serve/reply.h"

namespace cleave::serve {

using nlohmann::json;

namespace {

// Token texts may hold part of a UTF-8 character: replaced, never an exception.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

json empty_logprobs(Endpoint e) {
  if (e == Endpoint::chat) return json{{"content", json::array()}};
  return json{{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

}  // namespace

Reply::Reply(const Tokenizer& tokenizer, ReplySetup setup)
    : tok_(tokenizer), s_(std::move(setup)), text_(tokenizer, s_.stop) {
  lp_ = empty_logprobs(s_.endpoint), step_lp_ = lp_;
  if (s_.echo) {
    std::vector<uint32_t> ids(s_.prompt.begin(), s_.prompt.end());
    shown_ = tok_.decode(ids);
    // The first prompt token has no log-probability (nothing before it): null, as OpenAI's.
    if (s_.logprobs >= 0 && !s_.prompt.empty()) token_entry(s_.prompt[0], 0.0f, {}, false);
  }
}

std::string Reply::token_text(int32_t id) const { return tok_.decode({uint32_t(id)}); }

void Reply::token_entry(int32_t token, float logprob, const std::vector<TokenLogprob>& top,
                         bool has_logprob) {
  // The entry once, then into both the whole answer's list and the next chunk's.
  const std::string text = token_text(token);
  const bool chat = s_.endpoint == Endpoint::chat;
  json alts = chat ? json::array() : json::object();
  for (const TokenLogprob& t : top) {
    const std::string alt = token_text(t.token);
    if (chat) alts.push_back({{"token", alt}, {"logprob", t.logprob}, {"bytes", bytes_of(alt)}});
    else alts[alt] = t.logprob;
  }
  for (json* lp : {&lp_, &step_lp_}) {
    if (chat) {
      (*lp)["content"].push_back(
          {{"token", text}, {"logprob", logprob}, {"bytes", bytes_of(text)}, {"top_logprobs", alts}});
      continue;
    }
    (*lp)["tokens"].push_back(text);
    (*lp)["token_logprobs"].push_back(has_logprob ? json(logprob) : json(nullptr));
    (*lp)["top_logprobs"].push_back(has_logprob ? alts : json(nullptr));
    (*lp)["text_offset"].push_back(offset_);
  }
  offset_ += int64_t(text.size());
}

json Reply::usage() const {
  const int64_t prompt = int64_t(s_.prompt.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", made_}, {"total_tokens", prompt + made_}};
}

json Reply::chunk(const std::string& text, const json& logprobs, const char* finish) const {
  json choice = {{"index", 0},
                 {"logprobs", s_.logprobs >= 0 ? logprobs : json(nullptr)},
                 {"finish_reason", finish ? json(finish) : json(nullptr)}};
  json j = {{"id", s_.id}, {"created", s_.created}, {"model", s_.model}};
  if (s_.endpoint == Endpoint::chat) {
    j["object"] = "chat.completion.chunk";
    choice["delta"] = text.empty() && finish ? json::object() : json{{"content", text}};
  } else {
    j["object"] = "text_completion";
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  if (finish) j["usage"] = usage();
  return j;
}

std::string Reply::take(const Event& e, bool& ended) {
  ended = false;
  std::string out;
  if (s_.stream && first_chunk_) {
    first_chunk_ = false;
    if (s_.endpoint == Endpoint::chat) {
      json first = chunk("", json(nullptr), nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      out += sse(first);
    } else if (s_.echo) {
      out += sse(chunk(shown_, json(nullptr), nullptr));
    }
  }
  if (e.prompt) {
    if (s_.logprobs >= 0) token_entry(e.token, e.logprob, e.top, true);
    return out;
  }
  const char* finish = nullptr;
  std::string piece;
  if (e.finish == Finish::error) {
    error_ = e.error.empty() ? "the request failed" : e.error;
    ended = true;
    if (s_.stream)
      out += sse(json{{"error", {{"message", error_}, {"type", "server_error"}, {"param", nullptr},
                                 {"code", nullptr}}}});
    return out;
  }
  if (e.finish != Finish::none) {
    piece = text_.finish();
    finish = e.finish == Finish::length ? "length" : "stop";
  } else {
    ++made_;
    if (s_.logprobs >= 0) token_entry(e.token, e.logprob, e.top, true);
    const bool stopped = text_.add(e.token);
    piece = text_.take();
    if (stopped) finish = "stop";
  }
  shown_ += piece;
  if (finish) finish_ = finish, ended = true;
  if (s_.stream && (!piece.empty() || finish || s_.logprobs >= 0)) {
    out += sse(chunk(piece, step_lp_, finish));
    step_lp_ = empty_logprobs(s_.endpoint);
  }
  return out;
}

std::string Reply::stream_end() const {
  std::string out;
  if (s_.include_usage) {
    json j = {{"id", s_.id}, {"created", s_.created}, {"model", s_.model},
              {"object", s_.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
              {"choices", json::array()}, {"usage", usage()}};
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

std::string Reply::body() const {
  json choice = {{"index", 0},
                 {"logprobs", s_.logprobs >= 0 ? lp_ : json(nullptr)},
                 {"finish_reason", finish_}};
  json j = {{"id", s_.id}, {"created", s_.created}, {"model", s_.model}};
  if (s_.endpoint == Endpoint::chat) {
    j["object"] = "chat.completion";
    choice["message"] = {{"role", "assistant"}, {"content", shown_}};
  } else {
    j["object"] = "text_completion";
    choice["text"] = shown_;
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage();
  return dump(j);
}

}  // namespace cleave::serve
