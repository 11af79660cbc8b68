// The OpenAI API's requests as cleave's server reads them (docs/serving.md): POST /v1/completions
// and POST /v1/chat/completions bodies parsed and checked field by field, and the errors a client
// gets, in OpenAI's shape. Every field the API defines is either implemented, or accepted at its
// default only (so that clients such as LangChain, which send the defaults, work) and refused
// with a message naming it otherwise; a field the API does not define is refused.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::serve {

// What a client gets for a bad request: an HTTP status and OpenAI's error object,
// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}} (param and code null when
// empty).
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "");
  int status;
  std::string param, type, code;
};
std::string error_body(const ApiError& e);

// The fields both endpoints share.
struct RequestCommon {
  std::string model;
  int64_t max_tokens = -1;  // not given: the endpoint's default (the server's to choose)
  float temperature = 1.0f;
  int top_k = 0;  // an extension (vLLM's, llama.cpp's): 0 or -1 in the body mean all tokens
  // An extension (vLLM's): the tokenizer's end-of-text token does not end the completion, which
  // runs to max_tokens or a stop string (benchmarks and tests of a fixed length).
  bool ignore_eos = false;
  float top_p = 1.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage (stream only)
  // Completions: logprobs 0..5 (null: -1). Chat: top_logprobs 0..20 when logprobs is true, else -1.
  int logprobs = -1;
};

// POST /v1/completions. The prompt is a string or token ids (a list of integers), or a list of
// one of those; more than one prompt is refused (param "prompt").
struct CompletionRequest : RequestCommon {
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;  // when prompt_text is empty; each id >= 0 (checked)
  bool echo = false;
};

struct ChatMessage {
  std::string role;     // system, user or assistant ("developer" is read as system)
  std::string content;  // a string, or the concatenated text of a list of {"type": "text"} parts
};

// POST /v1/chat/completions. max_completion_tokens is read as max_tokens.
struct ChatRequest : RequestCommon {
  std::vector<ChatMessage> messages;  // at least one
};

// Parse and check a body. `model` is the served model's name: another name is a 404 with code
// "model_not_found". Malformed JSON, an unknown field, a field of the wrong type or outside its
// range, and an unimplemented field away from its default are 400s naming the field (param).
CompletionRequest parse_completion(std::string_view body, const std::string& model);
ChatRequest parse_chat(std::string_view body, const std::string& model);

// Chat templates cleave renders: ChatML (the default), Llama 3's and Llama 2's / Mistral's
// [INST] format.
enum class ChatTemplate { chatml, llama3, llama2 };
const char* template_name(ChatTemplate t);
// Which known template a tokenizer's Jinja chat_template is (by its markers); nullopt when it is
// none cleave knows (the server then uses ChatML and says so at start-up). "" is ChatML.
std::optional<ChatTemplate> recognize_template(const std::string& jinja);

// The prompt for messages, ending where the assistant's reply begins, and the text that ends a
// reply in this template (ChatML's "<|im_end|>", Llama 3's "<|eot_id|>", Llama 2's "</s>"). The
// markers are plain text here: encoding the text with the tokenizer turns those its vocabulary
// holds as special tokens into them, and the others stay text. The template's beginning-of-text
// marker is left out: the server puts the tokenizer's BOS first when it has one.
struct RenderedChat {
  std::string prompt;
  std::string end_of_turn;
};
RenderedChat render_chat(const std::vector<ChatMessage>& messages, ChatTemplate t);

}  // namespace cleave::serve
