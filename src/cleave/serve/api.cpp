// OpenAI's request bodies read field by field (api.h). Each endpoint lists every field the API
// defines and the body's keys are checked against that list before anything else, so a misspelt
// or unknown setting is refused rather than dropped.
#include "cleave/serve/api.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

namespace cleave::serve {

using json = nlohmann::json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string type,
                   std::string code)
    : std::runtime_error(message),
      status(status),
      param(std::move(param)),
      type(std::move(type)),
      code(std::move(code)) {}

std::string error_body(const ApiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  const json body = {
      {"error",
       {{"message", e.what()}, {"type", e.type}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}};
  // A message may quote a client's bytes, which need not be UTF-8.
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// Far deeper than any request cleave accepts; a body nested deeper is refused before the recursive
// comparisons and dumps below could exhaust the stack.
constexpr int kMaxDepth = 64;

// Every field the API defines for each endpoint, and vLLM's extensions top_k (llama.cpp reads it
// too) and ignore_eos.
constexpr const char* kCompletionFields[] = {
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
    "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
    "top_p", "user", "top_k", "ignore_eos"};

constexpr const char* kChatFields[] = {
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options", "top_k", "ignore_eos"};

[[noreturn]] void fail(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// OpenAI's param is the top-level field, while the message names the place inside it
// ("messages[2].content").
std::string param_of(const std::string& name) { return name.substr(0, name.find_first_of(".[")); }

// A client's value in a message, cut short: an array or object can be long.
std::string shown(const json& v) {
  const std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

std::string got(const json& v) { return std::string(", got ") + v.type_name(); }

// The API documents null as "the default" for every optional field, so null reads as absent.
const json* get(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& v, const std::string& name) {
  if (!v.is_number()) fail(param_of(name), name + " must be a number" + got(v));
  return v.get<double>();
}

// 3.0 is an integer as JSON reads it; 3.5 is not.
int64_t integer(const json& v, const std::string& name, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  if (!v.is_number()) fail(param_of(name), name + " must be an integer" + got(v));
  const double d = v.get<double>();
  if (v.is_number_float() && d != std::trunc(d))
    fail(param_of(name), name + " must be an integer, got " + shown(v));
  const bool fits = v.is_number_float() ? d >= -0x1p63 && d < 0x1p63
                                        : !v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX);
  const int64_t i = !fits ? 0 : v.is_number_float() ? int64_t(d) : v.get<int64_t>();
  if (!fits || i < lo || i > hi) {
    const std::string range = lo == INT64_MIN ? "a 64-bit integer"
                              : hi == INT64_MAX
                                  ? "at least " + std::to_string(lo)
                                  : "between " + std::to_string(lo) + " and " + std::to_string(hi);
    fail(param_of(name), name + " must be " + range + ", got " + shown(v));
  }
  return i;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) fail(param_of(name), name + " must be a boolean" + got(v));
  return v.get<bool>();
}

const std::string& text(const json& v, const std::string& name) {
  if (!v.is_string()) fail(param_of(name), name + " must be a string" + got(v));
  return v.get_ref<const std::string&>();
}

enum class Kind { any, number, integer, boolean, string, array, object };

void check_kind(const json& v, const std::string& name, Kind kind) {
  switch (kind) {
    case Kind::any: return;
    case Kind::number: number(v, name); return;
    case Kind::integer: integer(v, name); return;
    case Kind::boolean: boolean(v, name); return;
    case Kind::string: text(v, name); return;
    case Kind::array:
      if (!v.is_array()) fail(param_of(name), name + " must be an array" + got(v));
      return;
    case Kind::object:
      if (!v.is_object()) fail(param_of(name), name + " must be an object" + got(v));
      return;
  }
}

// Metadata (who is asking, a cache key): it changes nothing in the reply, so any value of its
// kind is accepted.
void metadata(const json& body, const char* key, Kind kind) {
  if (const json* v = get(body, key)) check_kind(*v, key, kind);
}

// A setting the API defines and cleave does not implement: accepted at its default (null, or one
// of `defaults`, as JSON text), so that clients sending the defaults work, and refused otherwise,
// so that no client gets a reply made without the setting it asked for.
void only_default(const json& body, const char* key, Kind kind,
                  std::initializer_list<const char*> defaults = {}) {
  const json* v = get(body, key);
  if (!v) return;
  check_kind(*v, key, kind);
  std::string listed;
  for (size_t i = 0; i < defaults.size(); ++i) {
    if (*v == json::parse(defaults.begin()[i])) return;
    listed += std::string(defaults.begin()[i]) + (i + 1 == defaults.size() ? " or " : ", ");
  }
  fail(key, std::string(key) + " = " + shown(*v) + " is not supported: cleave only supports its default (" +
                listed + "null)");
}

json parse_body(std::string_view body) {
  json j;
  try {
    j = json::parse(body.begin(), body.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth)
        fail("", "The request body is not valid JSON for this server: it is nested more than " +
                     std::to_string(kMaxDepth) + " levels deep");
      return true;
    });
  } catch (const json::parse_error& e) {
    const std::string what = e.what();  // "[json.exception.parse_error.101] parse error at line..."
    const size_t from = what.find("] ");
    // The message quotes the bytes the parser stopped at, which need not be UTF-8: what cannot be
    // shown becomes U+FFFD.
    const json quoted = json(from == std::string::npos ? what : what.substr(from + 2));
    fail("", "The request body is not valid JSON: " +
                 json::parse(quoted.dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>());
  }
  if (!j.is_object())
    fail("", std::string("The request body is not valid JSON for this endpoint: it is ") +
                 (j.is_array() ? "an array" : std::string("a ") + j.type_name()) +
                 ", where a JSON object is expected");
  return j;
}

template <size_t N>
void refuse_unknown(const json& body, const char* const (&fields)[N]) {
  for (const auto& [key, value] : body.items())
    if (std::find_if(fields, fields + N, [&](const char* f) { return key == f; }) == fields + N)
      fail(key, "Unrecognized request argument supplied: " + key);
}

// The fields both endpoints read the same way; max_tokens and logprobs differ and are the
// caller's.
void read_common(const json& body, const std::string& served, RequestCommon& r) {
  const json* model = get(body, "model");
  if (!model) fail("model", "You must provide a model parameter");
  r.model = text(*model, "model");
  if (r.model != served)
    throw ApiError(404, "The model `" + r.model + "` does not exist: this server serves `" + served + "`",
                   "model", "invalid_request_error", "model_not_found");

  if (const json* v = get(body, "temperature")) {
    const double t = number(*v, "temperature");
    if (!(t >= 0 && t <= 2)) fail("temperature", "temperature must be between 0 and 2, got " + shown(*v));
    r.temperature = float(t);
  }
  if (const json* v = get(body, "top_p")) {
    const double p = number(*v, "top_p");
    if (!(p > 0 && p <= 1)) fail("top_p", "top_p must be greater than 0 and at most 1, got " + shown(*v));
    r.top_p = float(p);
  }
  if (const json* v = get(body, "top_k"))
    r.top_k = int(std::max<int64_t>(0, integer(*v, "top_k", -1, INT_MAX)));
  if (const json* v = get(body, "ignore_eos")) r.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = get(body, "seed"))  // any 64-bit integer: negative ones keep their bits
    r.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(integer(*v, "seed"));

  if (const json* v = get(body, "stop")) {
    if (v->is_string()) {
      r.stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      if (v->size() > 4)
        fail("stop", "stop holds " + std::to_string(v->size()) + " sequences: at most 4 are allowed");
      for (size_t i = 0; i < v->size(); ++i)
        r.stop.push_back(text((*v)[i], "stop[" + std::to_string(i) + "]"));
    } else {
      fail("stop", "stop must be a string or an array of strings" + got(*v));
    }
    if (std::find(r.stop.begin(), r.stop.end(), "") != r.stop.end())
      fail("stop", "stop sequences must not be empty");
  }

  if (const json* v = get(body, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = get(body, "stream_options")) {
    if (!r.stream) fail("stream_options", "stream_options is only allowed when stream is true");
    check_kind(*v, "stream_options", Kind::object);
    for (const auto& [key, value] : v->items()) {
      if (key != "include_usage") fail("stream_options", "Unrecognized argument in stream_options: " + key);
      if (!value.is_null()) r.include_usage = boolean(value, "stream_options.include_usage");
    }
  }

  only_default(body, "n", Kind::integer, {"1"});
  only_default(body, "frequency_penalty", Kind::number, {"0"});
  only_default(body, "presence_penalty", Kind::number, {"0"});
  only_default(body, "logit_bias", Kind::object, {"{}"});
  metadata(body, "user", Kind::string);
}

void read_prompt(const json& body, CompletionRequest& r) {
  const json* p = get(body, "prompt");
  if (!p) fail("prompt", "You must provide a prompt");
  const std::string shapes =
      "prompt must be a string, an array of token ids, or an array holding one of those: cleave "
      "takes one prompt per request";
  if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {  // a batch
    if (p->size() != 1)
      fail("prompt",
           "prompt holds " + std::to_string(p->size()) + " prompts: cleave takes one prompt per request");
    p = &(*p)[0];
  }
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) fail("prompt", "prompt must not be empty");
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) fail("prompt", shapes + got(*p));
  if (p->empty()) fail("prompt", "prompt must not be empty");
  for (size_t i = 0; i < p->size(); ++i) {
    if (!(*p)[i].is_number()) fail("prompt", shapes);
    r.prompt_ids.push_back(int32_t(integer((*p)[i], "prompt[" + std::to_string(i) + "]", 0, INT32_MAX)));
  }
}

// One text part's text; any other kind of part is refused, as cleave's models read text only.
std::string part_text(const json& part, const std::string& at) {
  if (!part.is_object()) fail("messages", at + " must be an object" + got(part));
  const json* type = get(part, "type");
  if (!type) fail("messages", at + ".type is required");
  const std::string& kind = text(*type, at + ".type");
  if (kind != "text") fail("messages", at + " is a \"" + kind + "\" part: cleave reads text parts only");
  for (const auto& [key, value] : part.items())
    if (key != "type" && key != "text") fail("messages", "Unrecognized argument in " + at + ": " + key);
  const json* t = get(part, "text");
  if (!t) fail("messages", at + ".text is required");
  return text(*t, at + ".text");
}

ChatMessage read_message(const json& m, const std::string& at) {
  if (!m.is_object()) fail("messages", at + " must be an object" + got(m));
  const json* role = get(m, "role");
  if (!role) fail("messages", at + ".role is required");
  ChatMessage out{text(*role, at + ".role"), ""};
  if (out.role == "tool" || out.role == "function")
    fail("messages", at + " has role \"" + out.role + "\": cleave does not support tools or functions");
  if (out.role != "system" && out.role != "developer" && out.role != "user" && out.role != "assistant")
    fail("messages",
         at + ".role must be one of system, developer, user, assistant, got \"" + out.role + "\"");
  const bool assistant = out.role == "assistant";

  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content") continue;
    const std::string name = at + "." + key;
    if (key == "name") {  // who speaks: metadata the templates have no place for
      if (!value.is_null()) text(value, name);
    } else if (assistant &&
               (key == "tool_calls" || key == "function_call" || key == "refusal" || key == "audio")) {
      // What an earlier reply carried; cleave never makes these, so only their empty forms come back.
      if (!value.is_null() && !(key == "tool_calls" && value == json::array()))
        fail("messages", name + " is not supported: cleave does not support tools, refusals or audio");
    } else {
      fail("messages", "Unrecognized argument in " + at + ": " + key);
    }
  }

  const json* content = get(m, "content");
  if (!content) {
    if (!assistant) fail("messages", at + ".content is required: only an assistant message may have none");
  } else if (content->is_string()) {
    out.content = content->get<std::string>();
  } else if (content->is_array()) {
    for (size_t j = 0; j < content->size(); ++j)
      out.content += part_text((*content)[j], at + ".content[" + std::to_string(j) + "]");
  } else {
    fail("messages", at + ".content must be a string or an array of content parts" + got(*content));
  }
  if (out.role == "developer") out.role = "system";  // OpenAI's newer name for the system role
  return out;
}

}  // namespace

CompletionRequest parse_completion(std::string_view text_body, const std::string& model) {
  const json body = parse_body(text_body);
  refuse_unknown(body, kCompletionFields);
  CompletionRequest r;
  read_common(body, model, r);
  read_prompt(body, r);
  if (const json* v = get(body, "max_tokens")) r.max_tokens = integer(*v, "max_tokens", 0);
  if (const json* v = get(body, "logprobs")) r.logprobs = int(integer(*v, "logprobs", 0, 5));
  if (const json* v = get(body, "echo")) r.echo = boolean(*v, "echo");
  only_default(body, "best_of", Kind::integer, {"1"});
  only_default(body, "suffix", Kind::string, {"\"\""});
  return r;
}

ChatRequest parse_chat(std::string_view text_body, const std::string& model) {
  const json body = parse_body(text_body);
  refuse_unknown(body, kChatFields);
  ChatRequest r;
  read_common(body, model, r);

  const json* messages = get(body, "messages");
  if (!messages) fail("messages", "You must provide messages");
  check_kind(*messages, "messages", Kind::array);
  if (messages->empty()) fail("messages", "messages must not be empty");
  for (size_t i = 0; i < messages->size(); ++i)
    r.messages.push_back(read_message((*messages)[i], "messages[" + std::to_string(i) + "]"));

  const json* max_tokens = get(body, "max_tokens");
  if (max_tokens) r.max_tokens = integer(*max_tokens, "max_tokens", 1);
  if (const json* v = get(body, "max_completion_tokens")) {
    const int64_t n = integer(*v, "max_completion_tokens", 1);
    if (max_tokens && n != r.max_tokens)
      fail("max_completion_tokens", "max_tokens = " + std::to_string(r.max_tokens) +
                                        " and max_completion_tokens = " + std::to_string(n) +
                                        " disagree: give one of them");
    r.max_tokens = n;
  }

  const json* logprobs = get(body, "logprobs");
  const bool want_logprobs = logprobs && boolean(*logprobs, "logprobs");
  if (const json* v = get(body, "top_logprobs")) {
    const int64_t k = integer(*v, "top_logprobs", 0, 20);
    if (!want_logprobs) fail("top_logprobs", "top_logprobs is only allowed when logprobs is true");
    r.logprobs = int(k);
  } else if (want_logprobs) {
    r.logprobs = 0;
  }

  only_default(body, "tools", Kind::array, {"[]"});
  only_default(body, "tool_choice", Kind::any, {"\"none\""});
  only_default(body, "functions", Kind::array, {"[]"});
  only_default(body, "function_call", Kind::any, {"\"none\""});
  metadata(body, "parallel_tool_calls", Kind::boolean);  // no effect without tools
  only_default(body, "response_format", Kind::object, {R"({"type":"text"})"});
  only_default(body, "service_tier", Kind::string, {"\"auto\"", "\"default\""});
  only_default(body, "store", Kind::boolean, {"false"});
  metadata(body, "metadata", Kind::object);
  only_default(body, "modalities", Kind::array, {R"(["text"])"});
  only_default(body, "prediction", Kind::object);
  only_default(body, "audio", Kind::object);
  only_default(body, "reasoning_effort", Kind::string);
  only_default(body, "verbosity", Kind::string, {"\"medium\""});
  only_default(body, "web_search_options", Kind::object);
  metadata(body, "safety_identifier", Kind::string);
  // Where and how long OpenAI keeps a prompt's cache: no effect on the reply.
  metadata(body, "prompt_cache_key", Kind::string);
  metadata(body, "prompt_cache_retention", Kind::string);
  return r;
}

const char* template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::llama2: return "llama2";
  }
  return "?";
}

std::optional<ChatTemplate> recognize_template(const std::string& jinja) {
  auto has = [&](const char* marker) { return jinja.find(marker) != std::string::npos; };
  if (jinja.empty() || has("<|im_start|>")) return ChatTemplate::chatml;
  if (has("<|start_header_id|>") && has("<|eot_id|>")) return ChatTemplate::llama3;
  if (has("[INST]")) return ChatTemplate::llama2;
  return std::nullopt;
}

namespace {

// Llama 2's format has no role names: a system message can only ride in the first user turn, and
// the turns must alternate for the [INST] pairs to mean anything.
std::string render_llama2(const std::vector<ChatMessage>& messages) {
  size_t i = 0;
  std::string system;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  if (has_system) system = messages[i++].content;
  const std::string rule =
      "the llama2 chat template needs an optional system message, then messages alternating user "
      "and assistant, starting and ending with user";
  std::string out;
  for (size_t turn = 0; i < messages.size(); ++i, ++turn) {
    const ChatMessage& m = messages[i];
    const char* want = turn % 2 == 0 ? "user" : "assistant";
    if (m.role != want)
      fail("messages",
           rule + ": messages[" + std::to_string(i) + "] is " + m.role + " where " + want + " is expected");
    if (turn == 0 && has_system)
      out += "[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content + " [/INST]";
    else if (turn % 2 == 0)
      out += "[INST] " + m.content + " [/INST]";
    else
      out += " " + m.content + " </s><s>";
  }
  // The reply must follow an [INST] turn: after an assistant turn (or none) the model would
  // answer nobody.
  if (messages.size() == size_t(has_system) || messages.back().role != "user") fail("messages", rule);
  return out;
}

}  // namespace

RenderedChat render_chat(const std::vector<ChatMessage>& messages, ChatTemplate t) {
  RenderedChat r;
  switch (t) {
    case ChatTemplate::chatml:
      for (const ChatMessage& m : messages)
        r.prompt += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      r.prompt += "<|im_start|>assistant\n";
      r.end_of_turn = "<|im_end|>";
      break;
    case ChatTemplate::llama3:
      for (const ChatMessage& m : messages)
        r.prompt += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      r.prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      r.end_of_turn = "<|eot_id|>";
      break;
    case ChatTemplate::llama2:
      r.prompt = render_llama2(messages);
      r.end_of_turn = "</s>";
      break;
  }
  return r;
}

}  // namespace cleave::serve
