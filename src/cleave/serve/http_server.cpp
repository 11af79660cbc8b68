#include "cleave/serve/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <ctime>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cleave/serve/connection.h"
#include "cleave/serve/reply.h"

namespace cleave::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct HttpServer::Impl {
  Impl(Engine& e, const Tokenizer& t, const ModelConfig& m, ServerOptions o)
      : engine(e), tok(t), model(m), o(std::move(o)), started(std::time(nullptr)) {}
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void fail(httplib::Response& res, const ApiError& e, const char* endpoint);
  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  std::string metrics_text();

  Engine& engine;
  const Tokenizer& tok;
  ModelConfig model;
  ServerOptions o;
  int64_t started;
  httplib::Server svr;
  Metrics metrics;
  std::atomic<bool> draining{false};
  std::atomic<int> active{0};  // requests being answered (a stream outlives its handler)
  std::atomic<uint64_t> next_id{0};
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seeds_mu;
  std::thread listener;
};

namespace {

const char* endpoint_name(Endpoint e) { return e == Endpoint::chat ? "chat" : "completions"; }

// Equal strings in a time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// Debian's cpp-httplib is built with a listen backlog of 5: 32 clients connecting at once
// overflow it, and the kernel resets some of their connections. listen() on the listening
// socket again (found among this process's descriptors by its port) makes the queue as deep as
// the system allows.
void deepen_backlog(int port) {
  for (int fd = 0; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    const int bound = addr.ss_family == AF_INET
                          ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
                          : addr.ss_family == AF_INET6
                                ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                : -1;
    if (bound == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace

void HttpServer::Impl::fail(httplib::Response& res, const ApiError& e, const char* endpoint) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
  if (endpoint) metrics.request(endpoint, e.status);
}

bool HttpServer::Impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (o.api_key.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  if (same_secret(auth, "Bearer " + o.api_key)) return true;
  fail(res,
       ApiError(401,
                auth.empty() ? "No API key: send it in the Authorization header as 'Bearer KEY'."
                             : "Incorrect API key provided.",
                "", "invalid_request_error", "invalid_api_key"),
       nullptr);
  return false;
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res,
                                Endpoint endpoint) {
  const char* name = endpoint_name(endpoint);
  if (!authorized(req, res)) return metrics.request(name, 401);
  if (draining) return fail(res, ApiError(503, "The server is shutting down.", "", "server_error"), name);
  ReplySetup setup;
  setup.endpoint = endpoint;
  Sampling sm;
  RequestCommon common;
  std::vector<int32_t> ids;
  const char* prompt_param = "prompt";
  int64_t default_tokens = 16;  // OpenAI's default for completions
  try {
    if (endpoint == Endpoint::completions) {
      CompletionRequest r = parse_completion(req.body, o.model_name);
      if (r.prompt_text) {
        for (uint32_t id : tok.encode(*r.prompt_text)) ids.push_back(int32_t(id));
      } else {
        ids = r.prompt_ids;
        for (int32_t id : ids)
          if (id >= model.vocab_size)
            throw ApiError(400, "Prompt token id " + std::to_string(id) +
                                    " is outside the model's vocabulary of " +
                                    std::to_string(model.vocab_size) + " tokens.",
                           "prompt");
      }
      setup.echo = r.echo;
      common = r;
    } else {
      ChatRequest r = parse_chat(req.body, o.model_name);
      const RenderedChat chat = render_chat(r.messages, o.chat);
      ids.assign(tok.prefix_ids().begin(), tok.prefix_ids().end());
      for (uint32_t id : tok.encode_text(chat.prompt)) ids.push_back(int32_t(id));
      // The turn's end: a special token where the vocabulary has one, else its text.
      const std::vector<uint32_t> end = tok.encode_text(chat.end_of_turn);
      if (end.size() == 1) sm.stop_tokens.push_back(int32_t(end[0]));
      r.stop.push_back(chat.end_of_turn);
      prompt_param = "messages";
      common = r;
    }
    const int64_t n = int64_t(ids.size()), L = model.max_seq_len;
    if (n == 0) throw ApiError(400, "The prompt holds no token.", prompt_param);
    if (endpoint == Endpoint::chat) default_tokens = L - n;
    if (n >= L)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(L) +
                              " tokens; the prompt has " + std::to_string(n) +
                              ", which leaves no room for a completion.",
                     prompt_param, "invalid_request_error", "context_length_exceeded");
    const int64_t max_tokens = common.max_tokens >= 0 ? common.max_tokens : std::min(default_tokens, L - n);
    if (n + max_tokens > L)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(L) +
                              " tokens. However, you requested " + std::to_string(n + max_tokens) +
                              " tokens (" + std::to_string(n) + " in the prompt, " +
                              std::to_string(max_tokens) + " for the completion).",
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
    if (engine.blocks_for(n + max_tokens) > engine.pool_blocks())
      throw ApiError(400, "The prompt and max_tokens (" + std::to_string(n + max_tokens) +
                              " tokens) need more key/value cache than the server holds (" +
                              std::to_string(engine.pool_blocks()) + " blocks of " +
                              std::to_string(kernels::kAttentionKeyBlock) + " tokens).",
                     "max_tokens");
    sm.max_tokens = int(max_tokens);
    sm.temperature = common.temperature, sm.top_k = common.top_k, sm.top_p = common.top_p;
    if (common.seed) {
      sm.seed = *common.seed;
    } else {
      std::lock_guard lock(seeds_mu);
      sm.seed = seeds();
    }
    sm.logprobs = common.logprobs;
    sm.prompt_logprobs = setup.echo && common.logprobs >= 0;
    if (tok.eos_id() >= 0 && !common.ignore_eos) sm.stop_tokens.push_back(tok.eos_id());
  } catch (const ApiError& e) {
    return fail(res, e, name);
  }
  setup.id = std::string(endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  setup.model = o.model_name;
  setup.created = std::time(nullptr);
  setup.stream = common.stream, setup.include_usage = common.include_usage;
  setup.logprobs = common.logprobs;
  setup.prompt = ids;
  setup.stop = common.stop;
  const int64_t prompt_tokens = int64_t(ids.size());
  auto request = engine.submit(std::move(ids), sm);
  auto reply = std::make_shared<Reply>(tok, setup);
  // Timing of the tokens as the engine made them.
  auto last = std::make_shared<Clock::time_point>();
  auto observe = [this, request, last](const Event& e) {
    if (e.prompt || e.finish != Finish::none) return;
    if (*last == Clock::time_point{})
      metrics.time_to_first_token(std::chrono::duration<double>(e.at - request->submitted()).count());
    else
      metrics.time_per_output_token(std::chrono::duration<double>(e.at - *last).count());
    *last = e.at;
  };
  auto done = [this, request, reply, name, prompt_tokens](int status) {
    metrics.request(name, status);
    metrics.tokens(prompt_tokens, reply->completion_tokens());
    metrics.request_latency(std::chrono::duration<double>(Clock::now() - request->submitted()).count());
  };
  if (!setup.stream) {
    // A client that went away frees its blocks at its request's next token (or within 50 ms), as
    // a streamed one does: a poll(2) of its socket a token.
    const int connection = find_connection(req.remote_addr, req.remote_port, req.local_port);
    Event e;
    for (bool ended = false; !ended;) {
      if (request->next(e, std::chrono::milliseconds(50))) {
        observe(e);
        reply->take(e, ended);
      }
      if (!ended && connection >= 0 && connection_closed(connection)) {
        request->cancel();
        done(499);  // 499: the client closed the connection (nginx's code)
        res.status = 499;
        res.set_header("Connection", "close");
        return;
      }
    }
    request->cancel();  // a stop string may have ended the reply before the engine did
    if (reply->failed()) {
      done(500);
      return fail(res, ApiError(500, reply->error(), "", "server_error"), nullptr);
    }
    done(200);
    return res.set_content(reply->body(), "application/json");
  }
  ++active;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [request, reply, observe](size_t, httplib::DataSink& sink) {
        Event e;
        for (;;) {
          // A client that went away frees its blocks at once.
          if (!sink.is_writable()) return request->cancel(), false;
          if (!request->next(e, std::chrono::milliseconds(50))) continue;
          observe(e);
          bool ended = false;
          std::string out = reply->take(e, ended);
          if (ended) out += reply->stream_end();
          if (!out.empty() && !sink.write(out.data(), out.size())) return request->cancel(), false;
          if (ended) {
            request->cancel();
            sink.done();
            return true;
          }
        }
      },
      [this, done, request](bool success) {
        request->cancel();
        done(success ? 200 : 499);  // 499: the client closed the connection (nginx's code)
        --active;
      });
}

std::string HttpServer::Impl::metrics_text() {
  const EngineStats s = engine.stats();
  std::vector<Metrics::Value> counters{
      {"cleave_preemptions_total", "Running requests sent back to the queue for blocks.", double(s.preempted)},
      {"cleave_prefix_cached_tokens_total", "Prompt tokens taken from cached blocks, not computed.",
       double(s.prefix_tokens)},
      {"cleave_steps_total", "Forward steps of the engine.", double(s.steps)},
      {"cleave_held_steps_total",
       "Steps whose prompt rows serve.max_step_ratio held below serve.step_tokens.",
       double(s.held_steps)}};
  for (size_t l = 0; l < s.lane_tokens.size(); ++l)
    counters.push_back({"cleave_lane_tokens_total{lane=\"" + std::to_string(l) + "\"}",
                        "Tokens each lane (ep rank) computed, prompt and new, padding not counted.",
                        double(s.lane_tokens[l])});
  return metrics.text(
      {{"cleave_queue_length", "Requests waiting to join the running batch.", double(s.waiting)},
       {"cleave_running_requests", "Requests in the running batch.", double(s.running)},
       {"cleave_kv_blocks", "Blocks of the key/value pool.", double(s.blocks)},
       {"cleave_kv_blocks_used", "Blocks of the key/value pool in use.", double(s.blocks_used)},
       {"cleave_kv_blocks_shared", "Blocks held by more than one holder (a shared prefix).",
        double(s.blocks_shared)},
       {"cleave_kv_blocks_cached", "Blocks kept for prefixes of later requests.", double(s.blocks_cached)}},
      counters);
}

void HttpServer::Impl::routes() {
  svr.new_task_queue = [n = o.threads] { return new httplib::ThreadPool(size_t(n)); };
  svr.set_payload_max_length(size_t(o.max_body_bytes));
  svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) {
    generate(q, r, Endpoint::completions);
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
    generate(q, r, Endpoint::chat);
  });
  svr.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& r) {
    if (!authorized(q, r)) return;
    json m = {{"id", o.model_name}, {"object", "model"}, {"created", started},
              {"owned_by", "cleave"}, {"max_model_len", model.max_seq_len}};
    r.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(), "application/json");
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    if (draining) r.status = 503;
    r.set_content(json{{"status", draining ? "draining" : "ok"}}.dump(), "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  // Every other failure (no such route, a body over the limit, ...) gets an error body too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& q,
                                                                     httplib::Response& r) {
    if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message = "No route " + q.method + " " + q.path + ".";
    if (r.status == 413)
      message = "The request body is larger than the server's limit of " +
                std::to_string(o.max_body_bytes) + " bytes.";
    else if (r.status != 404)
      message = "The request could not be read (HTTP " + std::to_string(r.status) + ").";
    r.set_content(error_body(ApiError(r.status, message)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([this](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    fail(r, ApiError(500, what, "", "server_error"), nullptr);
  });
}

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, const ModelConfig& model,
                       ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, model, std::move(options))) {
  impl_->routes();
}

HttpServer::~HttpServer() {
  if (impl_->listener.joinable()) {
    impl_->svr.stop();
    impl_->listener.join();
  }
}

int HttpServer::bind() {
  Impl& m = *impl_;
  const int port = m.o.port == 0 ? m.svr.bind_to_any_port(m.o.host)
                                 : (m.svr.bind_to_port(m.o.host, m.o.port) ? m.o.port : -1);
  if (port < 0)
    throw std::runtime_error("cleave serve: cannot listen on " + m.o.host + ":" +
                             std::to_string(m.o.port) + " (in use, or not an address of this host)");
  deepen_backlog(port);
  return port;
}

void HttpServer::run(const std::function<bool()>& stop_requested) {
  Impl& m = *impl_;
  m.listener = std::thread([&m] { m.svr.listen_after_bind(); });
  while (!stop_requested()) {
    const Clock::time_point begin = Clock::now();
    if (m.engine.step()) m.metrics.step_time(std::chrono::duration<double>(Clock::now() - begin).count());
    else m.engine.wait_for_work(std::chrono::milliseconds(50));
  }
  // Draining: no new request; those running or queued finish within drain_seconds.
  m.draining = true;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(int64_t(m.o.drain_seconds * 1000));
  while (Clock::now() < deadline) {
    const EngineStats s = m.engine.stats();
    if (s.running == 0 && s.waiting == 0) break;
    if (!m.engine.step()) m.engine.wait_for_work(std::chrono::milliseconds(10));
  }
  m.engine.finish_all(Finish::error, "The server shut down before the request finished.");
  // The answers in flight go out before the socket closes.
  const Clock::time_point flush = Clock::now() + std::chrono::seconds(5);
  while (m.active > 0 && Clock::now() < flush) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.svr.stop();
  m.listener.join();
}

}  // namespace cleave::serve
