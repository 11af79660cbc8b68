// `cleave serve`'s HTTP side (docs/serving.md): OpenAI's completions and chat completions,
// GET /v1/models, /health and /metrics, over cpp-httplib. Handlers run on the library's thread
// pool; each parses and checks its request (serve/api.h), hands it to the engine and waits for
// its tokens, answering whole or streaming them as server-sent events. The engine steps on the
// caller's thread (run). A stop request (SIGTERM, which the caller watches) drains: new requests
// get 503, running ones finish within drain_seconds, then run returns.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cleave/data/tokenizer.h"
#include "cleave/serve/api.h"
#include "cleave/serve/engine.h"
#include "cleave/serve/metrics.h"

namespace cleave::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: a free port (bind says which)
  std::string api_key;  // empty: no key asked for
  std::string model_name;
  int64_t max_body_bytes = 1 << 20;
  int threads = 128;  // HTTP handler threads: a streaming client holds one
  double drain_seconds = 30;
  ChatTemplate chat = ChatTemplate::chatml;
};

class HttpServer {
 public:
  HttpServer(Engine& engine, const Tokenizer& tokenizer, const ModelConfig& model,
             ServerOptions options);
  ~HttpServer();
  // Binds the socket; returns the port (a clear error when it cannot).
  int bind();
  // Serves until stop_requested() (checked between steps), then drains and returns.
  void run(const std::function<bool()>& stop_requested);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave::serve
