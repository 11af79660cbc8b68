#include "cleave/comm/flight_recorder.h"

#include <algorithm>
#include <string_view>

namespace cleave::comm_detail {

namespace {

void pad(SafeText& out, int written, int width) {
  for (int i = written; i < width; ++i) out.chr(' ');
}

// Writes `s` left-aligned in `width` columns (at least one space after it).
void column(SafeText& out, const char* s, int width, size_t max = 64) {
  size_t n = 0;
  while (n < max && s[n]) ++n;
  out.str(s, max);
  pad(out, int(n), width);
  if (int(n) >= width) out.chr(' ');
}

}  // namespace

FlightRecorder::FlightRecorder(int capacity, int world_rank, double t0)
    : entries_(new FlightEntry[size_t(std::max(capacity, 1))]),
      capacity_(std::max(capacity, 1)),
      world_rank_(world_rank),
      t0_(t0) {}

uint64_t FlightRecorder::add(const WorkState& w, double issued) {
  std::lock_guard<std::mutex> lock(m_);
  const uint64_t id = next_.load(std::memory_order_relaxed);
  FlightEntry& e = entries_[(id - 1) % uint64_t(capacity_)];
  e.id.store(0, std::memory_order_release);  // readers skip the entry while it is rewritten
  e.seq = w.seq;
  e.op = int32_t(w.op);
  e.algo = int32_t(w.algo);
  e.p2p = w.kind == Kind::p2p;
  e.peer = w.peer;
  e.failed = 0;
  e.bytes = w.bytes;
  e.issued = issued;
  e.started = e.ended = 0;
  std::memset(e.group, 0, sizeof(e.group));
  std::memcpy(e.group, w.group.data(), std::min(w.group.size(), sizeof(e.group) - 1));
  e.id.store(id, std::memory_order_release);
  next_.store(id + 1, std::memory_order_release);
  return id;
}

FlightEntry* FlightRecorder::find(uint64_t id) {
  FlightEntry& e = entries_[(id - 1) % uint64_t(capacity_)];
  return e.id.load(std::memory_order_acquire) == id ? &e : nullptr;  // else overwritten since
}

void FlightRecorder::started(uint64_t id, double t) {
  std::lock_guard<std::mutex> lock(m_);
  if (FlightEntry* e = find(id)) e->started = t;
}

void FlightRecorder::ended(uint64_t id, double t, bool failed) {
  std::lock_guard<std::mutex> lock(m_);
  if (FlightEntry* e = find(id)) {
    e->ended = t;
    e->failed = failed;
  }
}

void FlightRecorder::write(SafeText& out) const {
  const uint64_t next = next_.load(std::memory_order_acquire);
  const uint64_t total = next - 1;
  const uint64_t first = total > uint64_t(capacity_) ? next - uint64_t(capacity_) : 1;
  out.str("cleave comm: flight recorder of rank ").num(world_rank_).str(" (last ")
      .unum(next - first).str(" of ").unum(total)
      .str(" operations; times in seconds since init_comm)\n");
  out.str("    seq        op              group            bytes        algo     issued    started      ended   duration\n");
  for (uint64_t id = first; id < next; ++id) {
    const FlightEntry& e = entries_[(id - 1) % uint64_t(capacity_)];
    if (e.id.load(std::memory_order_acquire) != id) continue;
    out.str("    ");
    char seq[32];
    {
      // "#12" for collectives, "p2p#3" for point-to-point operations
      std::string_view prefix = e.p2p ? "p2p#" : "#";
      size_t k = 0;
      for (char c : prefix) seq[k++] = c;
      char digits[24];
      int d = 0;
      uint64_t v = e.seq;
      do {
        digits[d++] = char('0' + v % 10);
        v /= 10;
      } while (v);
      while (d) seq[k++] = digits[--d];
      seq[k] = 0;
    }
    const bool fence = Op(e.op) == Op::create || Op(e.op) == Op::destroy;
    column(out, fence ? "-" : seq, 11);
    column(out, op_name(Op(e.op)), 16);
    column(out, e.group, 17, sizeof(e.group));
    {
      // the size, left-aligned in 13 columns (format it first to know its width)
      char tmp[32];
      size_t n = 0;
      struct Ctx { char* p; size_t* n; } ctx{tmp, &n};
      {
        SafeText b([](void* c, const char* d, size_t k) {
          auto* x = static_cast<Ctx*>(c);
          for (size_t i = 0; i < k && *x->n < 31; ++i) x->p[(*x->n)++] = d[i];
        }, &ctx);
        b.bytes(e.bytes);
      }
      tmp[n] = 0;
      column(out, tmp, 13);
    }
    if (Op(e.op) == Op::send || Op(e.op) == Op::recv) out.str("peer ").num(e.peer).str("  ");
    else if (Op(e.op) == Op::broadcast) out.str("root ").num(e.peer).str("  ");
    else column(out, fence ? "-" : algo_name(CommAlgo(e.algo)), 9);
    auto stamp = [&](double t) {
      if (t == 0) out.str("         -");
      else {
        const double rel = t - t0_;
        // right-align in 10 columns: count the digits of the integer part
        int width = 4;  // ".mmm"
        for (double x = rel < 0 ? -rel : rel; x >= 10; x /= 10) ++width;
        width += 1 + (rel < 0);
        pad(out, width, 10);
        out.fixed(rel, 3);
      }
      out.chr(' ');
    };
    stamp(e.issued);
    stamp(e.started);
    stamp(e.ended);
    if (e.started != 0 && e.ended != 0) out.str("  ").fixed((e.ended - e.started) * 1e3, 3).str(" ms");
    else if (e.started != 0) out.str("  RUNNING");
    else out.str("  QUEUED");
    if (e.failed) out.str("  FAILED");
    out.chr('\n');
  }
}

std::string FlightRecorder::report() const {
  std::string s;
  {
    SafeText out(SafeText::string_sink, &s);
    write(out);
  }
  return s;
}

}  // namespace cleave::comm_detail
