// OpenAI request bodies: every field read or refused by name, with the status and param a client
// gets both from the ApiError and from its JSON body; the chat templates rendered exactly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cleave/serve/api.h"

namespace cleave::serve {
namespace {

using json = nlohmann::json;

const std::string kModel = "tiny";

// Bodies with the required fields, plus `extra` (members of the object, comma-separated).
std::string completion(const std::string& extra = "") {
  return R"({"model":"tiny","prompt":"hi")" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string chat(const std::string& extra = "") {
  return R"({"model":"tiny","messages":[{"role":"user","content":"hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}
std::string chat_messages(const std::string& messages) {
  return R"({"model":"tiny","messages":)" + messages + "}";
}

// The error as a client reads it: status, and the fields of error_body's JSON (which must agree
// with the ApiError's own, null standing for empty).
testing::AssertionResult matches(const ApiError& e, int status, const std::string& param,
                                 const std::string& part, const std::string& code) {
  const json body = json::parse(error_body(e));
  const json& error = body.at("error");
  const json want_param = param.empty() ? json(nullptr) : json(param);
  const json want_code = code.empty() ? json(nullptr) : json(code);
  if (e.status != status || e.param != param || e.code != code || error.at("param") != want_param ||
      error.at("code") != want_code || error.at("message") != e.what() ||
      error.at("type") != "invalid_request_error" || e.type != "invalid_request_error" ||
      std::string(e.what()).find(part) == std::string::npos)
    return testing::AssertionFailure() << "got status " << e.status << ", body " << error_body(e);
  return testing::AssertionSuccess();
}

template <typename Parse>
testing::AssertionResult refused(Parse parse, const std::string& body, int status, const std::string& param,
                                 const std::string& part, const std::string& code) {
  try {
    parse(body, kModel);
  } catch (const ApiError& e) {
    return matches(e, status, param, part, code) << " for " << body;
  }
  return testing::AssertionFailure() << "accepted " << body;
}

testing::AssertionResult completion_refused(const std::string& body, const std::string& param,
                                            const std::string& part = "", int status = 400,
                                            const std::string& code = "") {
  return refused(parse_completion, body, status, param, part, code);
}
testing::AssertionResult chat_refused(const std::string& body, const std::string& param,
                                      const std::string& part = "", int status = 400,
                                      const std::string& code = "") {
  return refused(parse_chat, body, status, param, part, code);
}

TEST(ServeApi, ErrorBodyIsOpenAIsShape) {
  EXPECT_EQ(
      error_body(ApiError(400, "bad", "temperature")),
      R"({"error":{"code":null,"message":"bad","param":"temperature","type":"invalid_request_error"}})");
  EXPECT_EQ(
      error_body(ApiError(404, "gone", "", "invalid_request_error", "model_not_found")),
      R"({"error":{"code":"model_not_found","message":"gone","param":null,"type":"invalid_request_error"}})");
}

TEST(ServeApi, MalformedBodies) {
  for (const std::string body : {"{", R"({"model":"tiny",})", "not json", "", R"({"model":"tiny"} x)"}) {
    EXPECT_TRUE(
        completion_refused(body, "", "The request body is not valid JSON: parse error at line 1, column "));
    EXPECT_TRUE(chat_refused(body, "", "The request body is not valid JSON: parse error at line 1, column "));
  }
  for (const std::string body : {"[1, 2]", "\"x\"", "3", "null"})
    EXPECT_TRUE(completion_refused(body, "", "not valid JSON for this endpoint: it is "));
  EXPECT_TRUE(chat_refused("[]", "", "it is an array, where a JSON object is expected"));
  // Bytes that are not UTF-8 are quoted in the parser's message; the error body is still JSON.
  EXPECT_TRUE(completion_refused("{\"model\":\"\xff\xfe\"}", "", "not valid JSON"));
  // Nesting deep enough to exhaust a recursive reader's stack.
  EXPECT_TRUE(completion_refused(std::string(100000, '['), "", "nested more than"));
  EXPECT_TRUE(chat_refused(chat(R"("metadata":)" + std::string(70, '[') + std::string(70, ']')), "",
                           "nested more than 64 levels"));
}

TEST(ServeApi, UnknownFieldsAreNamed) {
  EXPECT_TRUE(
      completion_refused(completion(R"("foo":1)"), "foo", "Unrecognized request argument supplied: foo"));
  EXPECT_TRUE(
      chat_refused(chat(R"("temprature":0.5)"), "temprature", "Unrecognized request argument supplied"));
  // One endpoint's fields are unknown to the other.
  EXPECT_TRUE(completion_refused(completion(R"("messages":[])"), "messages", "Unrecognized"));
  EXPECT_TRUE(completion_refused(completion(R"("top_logprobs":2)"), "top_logprobs", "Unrecognized"));
  EXPECT_TRUE(chat_refused(chat(R"("echo":true)"), "echo", "Unrecognized"));
  EXPECT_TRUE(chat_refused(chat(R"("prompt":"x")"), "prompt", "Unrecognized"));
}

TEST(ServeApi, Model) {
  EXPECT_TRUE(completion_refused(R"({"prompt":"hi"})", "model", "You must provide a model parameter"));
  EXPECT_TRUE(chat_refused(R"({"model":null,"messages":[{"role":"user","content":"hi"}]})", "model",
                           "You must provide a model"));
  EXPECT_TRUE(
      completion_refused(R"({"model":5,"prompt":"hi"})", "model", "model must be a string, got number"));
  EXPECT_TRUE(completion_refused(R"({"model":"gpt-4","prompt":"hi"})", "model",
                                 "The model `gpt-4` does not exist: this server serves `tiny`", 404,
                                 "model_not_found"));
  EXPECT_TRUE(chat_refused(R"({"model":"Tiny","messages":[{"role":"user","content":"hi"}]})", "model",
                           "The model `Tiny` does not exist", 404, "model_not_found"));
}

TEST(ServeApi, MaxTokens) {
  EXPECT_EQ(parse_completion(completion(), kModel).max_tokens, -1);
  EXPECT_EQ(parse_completion(completion(R"("max_tokens":0)"), kModel).max_tokens, 0);
  EXPECT_EQ(parse_completion(completion(R"("max_tokens":3.0)"), kModel).max_tokens, 3);
  EXPECT_TRUE(completion_refused(completion(R"("max_tokens":-1)"), "max_tokens",
                                 "max_tokens must be at least 0, got -1"));
  EXPECT_TRUE(completion_refused(completion(R"("max_tokens":2.5)"), "max_tokens",
                                 "max_tokens must be an integer, got 2.5"));
  EXPECT_TRUE(
      completion_refused(completion(R"("max_tokens":"16")"), "max_tokens", "must be an integer, got string"));
  EXPECT_TRUE(completion_refused(completion(R"("max_tokens":1e300)"), "max_tokens", "must be at least 0"));

  EXPECT_EQ(parse_chat(chat(R"("max_tokens":1)"), kModel).max_tokens, 1);
  EXPECT_TRUE(chat_refused(chat(R"("max_tokens":0)"), "max_tokens", "max_tokens must be at least 1"));
  EXPECT_EQ(parse_chat(chat(R"("max_completion_tokens":7)"), kModel).max_tokens, 7);
  EXPECT_EQ(parse_chat(chat(R"("max_completion_tokens":7,"max_tokens":7)"), kModel).max_tokens, 7);
  EXPECT_TRUE(chat_refused(chat(R"("max_completion_tokens":0)"), "max_completion_tokens", "at least 1"));
  EXPECT_TRUE(chat_refused(chat(R"("max_completion_tokens":8,"max_tokens":7)"), "max_completion_tokens",
                           "max_tokens = 7 and max_completion_tokens = 8 disagree"));
}

TEST(ServeApi, SamplingRanges) {
  EXPECT_FLOAT_EQ(parse_completion(completion(R"("temperature":0)"), kModel).temperature, 0.0f);
  EXPECT_FLOAT_EQ(parse_chat(chat(R"("temperature":2)"), kModel).temperature, 2.0f);
  EXPECT_FLOAT_EQ(parse_chat(chat(R"("temperature":null)"), kModel).temperature, 1.0f);
  EXPECT_TRUE(completion_refused(completion(R"("temperature":-0.5)"), "temperature",
                                 "temperature must be between 0 and 2, got -0.5"));
  EXPECT_TRUE(chat_refused(chat(R"("temperature":2.5)"), "temperature", "between 0 and 2"));
  EXPECT_TRUE(chat_refused(chat(R"("temperature":"0.7")"), "temperature",
                           "temperature must be a number, got string"));

  EXPECT_FLOAT_EQ(parse_chat(chat(R"("top_p":0.5)"), kModel).top_p, 0.5f);
  EXPECT_FLOAT_EQ(parse_chat(chat(R"("top_p":1)"), kModel).top_p, 1.0f);
  EXPECT_TRUE(
      chat_refused(chat(R"("top_p":0)"), "top_p", "top_p must be greater than 0 and at most 1, got 0"));
  EXPECT_TRUE(completion_refused(completion(R"("top_p":1.5)"), "top_p", "at most 1"));
  EXPECT_TRUE(
      completion_refused(completion(R"("top_p":true)"), "top_p", "top_p must be a number, got boolean"));

  EXPECT_EQ(parse_completion(completion(R"("top_k":40)"), kModel).top_k, 40);
  EXPECT_EQ(parse_completion(completion(R"("top_k":-1)"), kModel).top_k, 0);
  EXPECT_EQ(parse_chat(chat(R"("top_k":0)"), kModel).top_k, 0);
  EXPECT_TRUE(chat_refused(chat(R"("top_k":-2)"), "top_k", "top_k must be between -1 and"));
  EXPECT_TRUE(chat_refused(chat(R"("top_k":1.5)"), "top_k", "top_k must be an integer"));
  EXPECT_TRUE(chat_refused(chat(R"("top_k":3000000000)"), "top_k", "top_k must be between -1 and"));

  EXPECT_FALSE(parse_completion(completion(), kModel).ignore_eos);
  EXPECT_TRUE(parse_completion(completion(R"("ignore_eos":true)"), kModel).ignore_eos);
  EXPECT_TRUE(parse_chat(chat(R"("ignore_eos":true)"), kModel).ignore_eos);
  EXPECT_TRUE(chat_refused(chat(R"("ignore_eos":1)"), "ignore_eos", "ignore_eos must be a boolean"));
}

TEST(ServeApi, Seed) {
  EXPECT_FALSE(parse_chat(chat(), kModel).seed.has_value());
  EXPECT_EQ(parse_chat(chat(R"("seed":42)"), kModel).seed, std::optional<uint64_t>(42));
  EXPECT_EQ(parse_chat(chat(R"("seed":-1)"), kModel).seed, std::optional<uint64_t>(UINT64_MAX));
  EXPECT_EQ(parse_completion(completion(R"("seed":18446744073709551615)"), kModel).seed,
            std::optional<uint64_t>(UINT64_MAX));
  EXPECT_EQ(parse_completion(completion(R"("seed":-9223372036854775808)"), kModel).seed,
            std::optional<uint64_t>(uint64_t(1) << 63));
  EXPECT_TRUE(completion_refused(completion(R"("seed":1.5)"), "seed", "seed must be an integer, got 1.5"));
  EXPECT_TRUE(completion_refused(completion(R"("seed":"7")"), "seed", "seed must be an integer, got string"));
  EXPECT_TRUE(completion_refused(completion(R"("seed":1e30)"), "seed", "seed must be a 64-bit integer"));
}

TEST(ServeApi, Stop) {
  EXPECT_TRUE(parse_chat(chat(R"("stop":null)"), kModel).stop.empty());
  EXPECT_EQ(parse_chat(chat(R"("stop":"\n")"), kModel).stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(parse_completion(completion(R"("stop":["a","bc","d","e"])"), kModel).stop,
            (std::vector<std::string>{"a", "bc", "d", "e"}));
  EXPECT_TRUE(parse_completion(completion(R"("stop":[])"), kModel).stop.empty());
  EXPECT_TRUE(completion_refused(completion(R"("stop":["a","b","c","d","e"])"), "stop", "at most 4"));
  EXPECT_TRUE(completion_refused(completion(R"("stop":"")"), "stop", "stop sequences must not be empty"));
  EXPECT_TRUE(chat_refused(chat(R"("stop":["a",""])"), "stop", "must not be empty"));
  EXPECT_TRUE(chat_refused(chat(R"("stop":["a",1])"), "stop", "stop[1] must be a string, got number"));
  EXPECT_TRUE(chat_refused(chat(R"("stop":3)"), "stop", "stop must be a string or an array of strings"));
}

TEST(ServeApi, Stream) {
  const ChatRequest r = parse_chat(chat(R"("stream":true,"stream_options":{"include_usage":true})"), kModel);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  const CompletionRequest c = parse_completion(completion(R"("stream":true,"stream_options":{})"), kModel);
  EXPECT_TRUE(c.stream);
  EXPECT_FALSE(c.include_usage);
  EXPECT_FALSE(parse_completion(completion(R"("stream":false,"stream_options":null)"), kModel).stream);
  EXPECT_TRUE(completion_refused(completion(R"("stream_options":{"include_usage":true})"), "stream_options",
                                 "stream_options is only allowed when stream is true"));
  EXPECT_TRUE(chat_refused(chat(R"("stream":false,"stream_options":{"include_usage":true})"),
                           "stream_options", "only allowed when stream is true"));
  EXPECT_TRUE(chat_refused(chat(R"("stream":true,"stream_options":{"foo":true})"), "stream_options",
                           "Unrecognized argument in stream_options: foo"));
  EXPECT_TRUE(chat_refused(chat(R"("stream":true,"stream_options":{"include_usage":"yes"})"),
                           "stream_options", "stream_options.include_usage must be a boolean, got string"));
  EXPECT_TRUE(chat_refused(chat(R"("stream":true,"stream_options":true)"), "stream_options",
                           "stream_options must be an object"));
  EXPECT_TRUE(chat_refused(chat(R"("stream":"true")"), "stream", "stream must be a boolean, got string"));
}

TEST(ServeApi, CompletionLogprobsAndEcho) {
  EXPECT_EQ(parse_completion(completion(R"("logprobs":null)"), kModel).logprobs, -1);
  EXPECT_EQ(parse_completion(completion(R"("logprobs":0)"), kModel).logprobs, 0);
  EXPECT_EQ(parse_completion(completion(R"("logprobs":5)"), kModel).logprobs, 5);
  EXPECT_TRUE(completion_refused(completion(R"("logprobs":6)"), "logprobs",
                                 "logprobs must be between 0 and 5, got 6"));
  EXPECT_TRUE(
      completion_refused(completion(R"("logprobs":true)"), "logprobs", "must be an integer, got boolean"));
  EXPECT_TRUE(parse_completion(completion(R"("echo":true)"), kModel).echo);
  EXPECT_FALSE(parse_completion(completion(), kModel).echo);
  EXPECT_TRUE(completion_refused(completion(R"("echo":1)"), "echo", "echo must be a boolean, got number"));
}

TEST(ServeApi, ChatLogprobs) {
  EXPECT_EQ(parse_chat(chat(), kModel).logprobs, -1);
  EXPECT_EQ(parse_chat(chat(R"("logprobs":false)"), kModel).logprobs, -1);
  EXPECT_EQ(parse_chat(chat(R"("logprobs":true)"), kModel).logprobs, 0);
  EXPECT_EQ(parse_chat(chat(R"("logprobs":true,"top_logprobs":20)"), kModel).logprobs, 20);
  EXPECT_EQ(parse_chat(chat(R"("logprobs":false,"top_logprobs":null)"), kModel).logprobs, -1);
  EXPECT_TRUE(
      chat_refused(chat(R"("top_logprobs":3)"), "top_logprobs", "only allowed when logprobs is true"));
  EXPECT_TRUE(
      chat_refused(chat(R"("logprobs":false,"top_logprobs":3)"), "top_logprobs", "when logprobs is true"));
  EXPECT_TRUE(chat_refused(chat(R"("logprobs":true,"top_logprobs":21)"), "top_logprobs", "between 0 and 20"));
  EXPECT_TRUE(chat_refused(chat(R"("logprobs":3)"), "logprobs", "logprobs must be a boolean, got number"));
}

TEST(ServeApi, PromptForms) {
  const CompletionRequest text = parse_completion(R"({"model":"tiny","prompt":"Once upon"})", kModel);
  EXPECT_EQ(text.prompt_text, std::optional<std::string>("Once upon"));
  EXPECT_TRUE(text.prompt_ids.empty());
  EXPECT_EQ(parse_completion(R"({"model":"tiny","prompt":["a time"]})", kModel).prompt_text,
            std::optional<std::string>("a time"));
  const CompletionRequest ids = parse_completion(R"({"model":"tiny","prompt":[1,0,3.0]})", kModel);
  EXPECT_FALSE(ids.prompt_text.has_value());
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 0, 3}));
  EXPECT_EQ(parse_completion(R"({"model":"tiny","prompt":[[7,8]]})", kModel).prompt_ids,
            (std::vector<int32_t>{7, 8}));

  const std::string one = "one prompt per request";
  for (const std::string prompt : {R"(["a","b"])", R"([[1],[2]])"})
    EXPECT_TRUE(completion_refused(R"({"model":"tiny","prompt":)" + prompt + "}", "prompt",
                                   "prompt holds 2 prompts"));
  for (const std::string prompt :
       {"5", "true", R"({"text":"a"})", R"([1,"a"])", R"([[1,"a"]])", R"([["a"]])"})
    EXPECT_TRUE(completion_refused(R"({"model":"tiny","prompt":)" + prompt + "}", "prompt", one));
  for (const std::string prompt : {R"("")", "[]", R"([""])", "[[]]"})
    EXPECT_TRUE(completion_refused(R"({"model":"tiny","prompt":)" + prompt + "}", "prompt",
                                   "prompt must not be empty"));
  EXPECT_TRUE(
      completion_refused(R"({"model":"tiny","prompt":[1,-1]})", "prompt", "prompt[1] must be between 0 and"));
  EXPECT_TRUE(
      completion_refused(R"({"model":"tiny","prompt":[2147483648]})", "prompt", "prompt[0] must be between"));
  EXPECT_TRUE(
      completion_refused(R"({"model":"tiny","prompt":[1.5]})", "prompt", "prompt[0] must be an integer"));
  EXPECT_TRUE(completion_refused(R"({"model":"tiny"})", "prompt", "You must provide a prompt"));
  EXPECT_TRUE(completion_refused(R"({"model":"tiny","prompt":null})", "prompt", "You must provide a prompt"));
}

TEST(ServeApi, Messages) {
  const ChatRequest r = parse_chat(chat_messages(R"([
      {"role":"developer","content":"Be brief."},
      {"role":"user","name":"ann","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null,"tool_calls":[],"refusal":null},
      {"role":"assistant"}])"),
                                   kModel);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Hello, there");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.messages[3].content, "");

  EXPECT_TRUE(chat_refused(R"({"model":"tiny"})", "messages", "You must provide messages"));
  EXPECT_TRUE(chat_refused(chat_messages(R"("hi")"), "messages", "messages must be an array, got string"));
  EXPECT_TRUE(chat_refused(chat_messages("[]"), "messages", "messages must not be empty"));
  EXPECT_TRUE(chat_refused(chat_messages(R"(["hi"])"), "messages", "messages[0] must be an object"));
  EXPECT_TRUE(
      chat_refused(chat_messages(R"([{"content":"hi"}])"), "messages", "messages[0].role is required"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":"a"},{"role":"tool","content":"4"}])"),
                           "messages", "messages[1] has role \"tool\": cleave does not support tools"));
  EXPECT_TRUE(
      chat_refused(chat_messages(R"([{"role":"function","content":"4"}])"), "messages", "role \"function\""));
  EXPECT_TRUE(
      chat_refused(chat_messages(R"([{"role":"robot","content":"4"}])"), "messages",
                   "messages[0].role must be one of system, developer, user, assistant, got \"robot\""));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":1,"content":"4"}])"), "messages",
                           "messages[0].role must be a string"));
  EXPECT_TRUE(chat_refused(
      chat_messages(
          R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}])"),
      "messages", "messages[0].content[1] is a \"image_url\" part: cleave reads text parts only"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":[{"type":"text"}]}])"), "messages",
                           "messages[0].content[0].text is required"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":[{"type":"text","text":"a","x":1}]}])"),
                           "messages", "Unrecognized argument in messages[0].content[0]: x"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":null}])"), "messages",
                           "messages[0].content is required: only an assistant message may have none"));
  EXPECT_TRUE(
      chat_refused(chat_messages(R"([{"role":"system"}])"), "messages", "messages[0].content is required"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":5}])"), "messages",
                           "messages[0].content must be a string or an array of content parts, got number"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":"a","name":5}])"), "messages",
                           "messages[0].name must be a string"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":"a","mood":"glad"}])"), "messages",
                           "Unrecognized argument in messages[0]: mood"));
  EXPECT_TRUE(
      chat_refused(chat_messages(R"([{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}])"),
                   "messages", "messages[0].tool_calls is not supported"));
  EXPECT_TRUE(chat_refused(chat_messages(R"([{"role":"user","content":"a","tool_calls":[]}])"), "messages",
                           "Unrecognized argument in messages[0]: tool_calls"));
}

// What LangChain and the OpenAI SDKs send, the unimplemented settings at their defaults.
TEST(ServeApi, DefaultsOfUnimplementedFieldsAreAccepted) {
  const std::string shared =
      R"("frequency_penalty":0,"presence_penalty":0.0,"logit_bias":{},"n":1,"user":"x")";
  const CompletionRequest c = parse_completion(completion(shared + R"(,"best_of":1,"suffix":null)"), kModel);
  EXPECT_EQ(c.prompt_text, std::optional<std::string>("hi"));
  EXPECT_NO_THROW(parse_completion(completion(R"("suffix":"","n":null,"best_of":1.0)"), kModel));
  const ChatRequest r = parse_chat(chat(shared + R"(,
      "tools":[],"tool_choice":"none","functions":[],"function_call":"none","parallel_tool_calls":true,
      "response_format":{"type":"text"},"service_tier":"auto","store":false,"metadata":{"k":"v"},
      "modalities":["text"],"prediction":null,"audio":null,"reasoning_effort":null,"verbosity":"medium",
      "web_search_options":null,"safety_identifier":"u1","prompt_cache_key":"k","prompt_cache_retention":"24h")"),
                                   kModel);
  EXPECT_EQ(r.messages.size(), 1u);
  EXPECT_NO_THROW(
      parse_chat(chat(R"("service_tier":"default","parallel_tool_calls":false,"tools":null)"), kModel));
}

TEST(ServeApi, UnimplementedFieldsAwayFromTheirDefaultAreRefused) {
  const std::string only = "is not supported: cleave only supports its default";
  const std::pair<const char*, const char*> shared[] = {{"n", "2"},
                                                        {"n", "0"},
                                                        {"frequency_penalty", "0.5"},
                                                        {"presence_penalty", "-1"},
                                                        {"logit_bias", R"({"50256":-100})"}};
  for (const auto& [field, value] : shared) {
    const std::string member = std::string("\"") + field + "\":" + value;
    EXPECT_TRUE(
        completion_refused(completion(member), field, std::string(field) + " = " + value + " " + only));
    EXPECT_TRUE(chat_refused(chat(member), field, only));
  }
  EXPECT_TRUE(completion_refused(completion(R"("n":2)"), "n",
                                 "n = 2 is not supported: cleave only supports its default (1 or null)"));
  EXPECT_TRUE(completion_refused(completion(R"("best_of":3)"), "best_of", only));
  EXPECT_TRUE(completion_refused(completion(R"("suffix":"end")"), "suffix", only));
  const std::pair<const char*, const char*> chat_only[] = {
      {"tools", R"([{"type":"function","function":{"name":"f"}}])"},
      {"tool_choice", R"("auto")"},
      {"functions", R"([{"name":"f"}])"},
      {"function_call", R"("auto")"},
      {"response_format", R"({"type":"json_object"})"},
      {"service_tier", R"("flex")"},
      {"store", "true"},
      {"modalities", R"(["text","audio"])"},
      {"prediction", R"({"type":"content","content":"x"})"},
      {"audio", R"({"voice":"alloy","format":"wav"})"},
      {"reasoning_effort", R"("low")"},
      {"verbosity", R"("high")"},
      {"web_search_options", "{}"}};
  for (const auto& [field, value] : chat_only)
    EXPECT_TRUE(chat_refused(chat(std::string("\"") + field + "\":" + value), field, only));
  EXPECT_TRUE(chat_refused(chat(R"("service_tier":"flex")"), "service_tier",
                           R"(cleave only supports its default ("auto", "default" or null))"));

  // Wrong types are named as such, metadata included.
  EXPECT_TRUE(completion_refused(completion(R"("n":1.5)"), "n", "n must be an integer, got 1.5"));
  EXPECT_TRUE(completion_refused(completion(R"("frequency_penalty":"0")"), "frequency_penalty",
                                 "frequency_penalty must be a number, got string"));
  EXPECT_TRUE(
      completion_refused(completion(R"("logit_bias":[])"), "logit_bias", "logit_bias must be an object"));
  EXPECT_TRUE(completion_refused(completion(R"("user":5)"), "user", "user must be a string, got number"));
  EXPECT_TRUE(completion_refused(completion(R"("suffix":5)"), "suffix", "suffix must be a string"));
  EXPECT_TRUE(
      chat_refused(chat(R"("parallel_tool_calls":"yes")"), "parallel_tool_calls", "must be a boolean"));
  EXPECT_TRUE(chat_refused(chat(R"("metadata":"x")"), "metadata", "metadata must be an object, got string"));
  EXPECT_TRUE(chat_refused(chat(R"("tools":{})"), "tools", "tools must be an array, got object"));
  EXPECT_TRUE(chat_refused(chat(R"("store":0)"), "store", "store must be a boolean"));
}

TEST(ServeApi, FullCompletionBody) {
  const CompletionRequest r = parse_completion(R"({
      "model":"tiny","prompt":"The capital of France is","max_tokens":16,"temperature":0.7,"top_p":0.9,
      "top_k":50,"seed":1234,"stop":["\n","."],"stream":true,"stream_options":{"include_usage":true},
      "logprobs":2,"echo":true,"n":1,"best_of":1,"frequency_penalty":0,"presence_penalty":0,
      "logit_bias":null,"suffix":null,"user":"u"})",
                                               kModel);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.prompt_text, std::optional<std::string>("The capital of France is"));
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_FLOAT_EQ(r.temperature, 0.7f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 50);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(1234));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.echo);
}

TEST(ServeApi, FullChatBody) {
  const ChatRequest r = parse_chat(R"({
      "model":"tiny",
      "messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"2+2?"},
                  {"role":"assistant","content":"4"},{"role":"user","content":"3+3?"}],
      "max_completion_tokens":32,"temperature":0.2,"top_p":0.95,"top_k":-1,"seed":-2,"stop":"###",
      "stream":true,"stream_options":{"include_usage":false},"logprobs":true,"top_logprobs":3,
      "n":1,"frequency_penalty":0,"presence_penalty":0,"logit_bias":{},"user":"u","tools":null,
      "tool_choice":null,"response_format":{"type":"text"},"store":false,"metadata":null})",
                                   kModel);
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "4");
  EXPECT_EQ(r.messages[3].content, "3+3?");
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.temperature, 0.2f);
  EXPECT_FLOAT_EQ(r.top_p, 0.95f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.seed, std::optional<uint64_t>(UINT64_MAX - 1));
  EXPECT_EQ(r.stop, std::vector<std::string>{"###"});
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_EQ(r.logprobs, 3);
}

const std::vector<ChatMessage> kConversation = {
    {"system", "Be terse."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "3+3?"}};

TEST(ServeApi, ChatMLTemplate) {
  const RenderedChat r = render_chat(kConversation, ChatTemplate::chatml);
  EXPECT_EQ(r.prompt,
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r.end_of_turn, "<|im_end|>");
}

TEST(ServeApi, Llama3Template) {
  const RenderedChat r = render_chat(kConversation, ChatTemplate::llama3);
  EXPECT_EQ(r.prompt,
            "<|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n3+3?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(r.end_of_turn, "<|eot_id|>");
}

TEST(ServeApi, Llama2Template) {
  const RenderedChat r = render_chat(kConversation, ChatTemplate::llama2);
  EXPECT_EQ(r.prompt, "[INST] <<SYS>>\nBe terse.\n<</SYS>>\n\n2+2? [/INST] 4 </s><s>[INST] 3+3? [/INST]");
  EXPECT_EQ(r.end_of_turn, "</s>");
  EXPECT_EQ(render_chat({{"user", "hi"}}, ChatTemplate::llama2).prompt, "[INST] hi [/INST]");

  auto refused = [](const std::vector<ChatMessage>& messages,
                    const std::string& part) -> testing::AssertionResult {
    try {
      render_chat(messages, ChatTemplate::llama2);
    } catch (const ApiError& e) {
      return matches(e, 400, "messages", part, "");
    }
    return testing::AssertionFailure() << "rendered";
  };
  EXPECT_TRUE(refused({{"user", "a"}, {"user", "b"}}, "messages[1] is user where assistant is expected"));
  EXPECT_TRUE(
      refused({{"assistant", "a"}, {"user", "b"}}, "messages[0] is assistant where user is expected"));
  EXPECT_TRUE(refused({{"system", "s"}, {"system", "t"}, {"user", "b"}}, "messages[1] is system where user"));
  EXPECT_TRUE(refused({{"user", "a"}, {"system", "s"}}, "messages[1] is system where assistant"));
  EXPECT_TRUE(refused({{"user", "a"}, {"assistant", "b"}}, "starting and ending with user"));
  EXPECT_TRUE(refused({{"system", "s"}}, "starting and ending with user"));
  // The other templates take any order.
  EXPECT_EQ(render_chat({{"assistant", "a"}}, ChatTemplate::chatml).prompt,
            "<|im_start|>assistant\na<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ServeApi, RecognizeTemplate) {
  EXPECT_EQ(recognize_template(""), ChatTemplate::chatml);
  EXPECT_EQ(recognize_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                               "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
            ChatTemplate::chatml);
  EXPECT_EQ(recognize_template("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
                               "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
                               "'<|eot_id|>' }}{% endfor %}"),
            ChatTemplate::llama3);
  EXPECT_EQ(recognize_template("{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
                               "message['content'] + ' [/INST]' }}{% endif %}"),
            ChatTemplate::llama2);
  EXPECT_EQ(recognize_template("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                               "'<end_of_turn>\\n' }}"),
            std::nullopt);
  EXPECT_EQ(recognize_template("{{ '<|start_header_id|>' + message['role'] }}"), std::nullopt);
  EXPECT_STREQ(template_name(ChatTemplate::chatml), "chatml");
  EXPECT_STREQ(template_name(ChatTemplate::llama3), "llama3");
  EXPECT_STREQ(template_name(ChatTemplate::llama2), "llama2");
}

}  // namespace
}  // namespace cleave::serve
