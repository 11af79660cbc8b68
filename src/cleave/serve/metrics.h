// The server's counters, gauges and histograms in Prometheus's text exposition format
// (GET /metrics): what vLLM, TGI and llama.cpp's server export, under cleave_ names.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cleave::serve {

// Cumulative buckets (Prometheus's "le"), a sum and a count. Thread-safe through Metrics.
struct Histogram {
  explicit Histogram(std::vector<double> bounds) : bounds(std::move(bounds)), counts(this->bounds.size(), 0) {}
  void observe(double x);
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // per bound: observations <= it
  uint64_t count = 0;
  double sum = 0;
};

class Metrics {
 public:
  Metrics();
  // A finished request: its endpoint ("completions", "chat"), HTTP status, token counts.
  void request(const std::string& endpoint, int status);
  void tokens(int64_t prompt, int64_t generated);
  void time_to_first_token(double seconds);
  void time_per_output_token(double seconds);
  void request_latency(double seconds);
  void step_time(double seconds);  // one engine step that ran a forward
  // The text for GET /metrics, with the caller's gauges (queue, batch, cache blocks) and
  // counters (the engine's), each {name, help, value}; a name may carry labels (name{k="v"}),
  // and the samples of one name follow each other.
  struct Value {
    std::string name, help;
    double value;
  };
  std::string text(const std::vector<Value>& gauges, const std::vector<Value>& counters) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_, latency_, step_;
};

}  // namespace cleave::serve
