#include "cleave/serve/metrics.h"

#include <sstream>

namespace cleave::serve {

void Histogram::observe(double x) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (x <= bounds[i]) ++counts[i];
  ++count;
  sum += x;
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      latency_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      step_({0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}
void Metrics::tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += uint64_t(prompt), generated_tokens_ += uint64_t(generated);
}
void Metrics::time_to_first_token(double s) {
  std::lock_guard lock(mu_);
  ttft_.observe(s);
}
void Metrics::time_per_output_token(double s) {
  std::lock_guard lock(mu_);
  tpot_.observe(s);
}
void Metrics::request_latency(double s) {
  std::lock_guard lock(mu_);
  latency_.observe(s);
}
void Metrics::step_time(double s) {
  std::lock_guard lock(mu_);
  step_.observe(s);
}

namespace {

void histogram(std::ostringstream& o, const std::string& name, const std::string& help,
               const Histogram& h) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < h.bounds.size(); ++i)
    o << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << h.counts[i] << "\n";
  o << name << "_bucket{le=\"+Inf\"} " << h.count << "\n";
  o << name << "_sum " << h.sum << "\n" << name << "_count " << h.count << "\n";
}

}  // namespace

std::string Metrics::text(const std::vector<Value>& gauges, const std::vector<Value>& counters) const {
  std::lock_guard lock(mu_);
  std::ostringstream o;
  o << "# HELP cleave_requests_total Requests answered, by endpoint and HTTP status.\n"
    << "# TYPE cleave_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    o << "cleave_requests_total{endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} "
      << n << "\n";
  o << "# HELP cleave_prompt_tokens_total Prompt tokens of the requests served.\n"
    << "# TYPE cleave_prompt_tokens_total counter\ncleave_prompt_tokens_total " << prompt_tokens_
    << "\n# HELP cleave_generation_tokens_total Tokens generated.\n"
    << "# TYPE cleave_generation_tokens_total counter\ncleave_generation_tokens_total "
    << generated_tokens_ << "\n";
  std::string family;  // the samples' name without labels: its HELP and TYPE go once
  auto sample = [&](const Value& v, const char* type) {
    const std::string name = v.name.substr(0, v.name.find('{'));
    if (name != family) o << "# HELP " << name << " " << v.help << "\n# TYPE " << name << " " << type << "\n";
    family = name;
    o << v.name << " " << v.value << "\n";
  };
  for (const Value& g : gauges) sample(g, "gauge");
  for (const Value& c : counters) sample(c, "counter");
  histogram(o, "cleave_time_to_first_token_seconds", "From a request's arrival to its first token.", ttft_);
  histogram(o, "cleave_time_per_output_token_seconds", "Between a request's successive tokens.", tpot_);
  histogram(o, "cleave_request_latency_seconds", "From a request's arrival to its end.", latency_);
  histogram(o, "cleave_step_seconds", "One engine step that ran a forward: its plan, the forward, its tokens out.", step_);
  return o.str();
}

}  // namespace cleave::serve
