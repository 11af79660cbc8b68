// SafeText: number formatting without the C library's locale-aware, allocating printf family, so
// the reports written from the SIGTERM handler stay async-signal-safe.
#include <unistd.h>

#include "cleave/comm/internal.h"

namespace cleave::comm_detail {

void SafeText::fd_sink(void* ctx, const char* data, size_t n) {
  const int fd = *static_cast<int*>(ctx);
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w <= 0) return;  // nothing sensible to do about a failing stderr
    data += w;
    n -= size_t(w);
  }
}

void SafeText::string_sink(void* ctx, const char* data, size_t n) {
  static_cast<std::string*>(ctx)->append(data, n);
}

SafeText& SafeText::unum(uint64_t v) {
  char tmp[24];
  int k = 0;
  do {
    tmp[k++] = char('0' + v % 10);
    v /= 10;
  } while (v);
  while (k) chr(tmp[--k]);
  return *this;
}

SafeText& SafeText::num(int64_t v) {
  if (v < 0) {
    chr('-');
    return unum(uint64_t(0) - uint64_t(v));
  }
  return unum(uint64_t(v));
}

SafeText& SafeText::fixed(double v, int decimals) {
  if (v != v) return str("nan");
  if (v < 0) {
    chr('-');
    v = -v;
  }
  if (v > 1e18) return str("inf");
  uint64_t scale = 1;
  for (int i = 0; i < decimals; ++i) scale *= 10;
  const uint64_t q = uint64_t(v * double(scale) + 0.5);
  unum(q / scale);
  if (decimals > 0) {
    chr('.');
    uint64_t frac = q % scale;
    for (uint64_t s = scale / 10; s > 0; s /= 10) {
      chr(char('0' + frac / s));
      frac %= s;
    }
  }
  return *this;
}

SafeText& SafeText::bytes(int64_t b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0 || v == double(int64_t(v))) num(int64_t(v));
  else fixed(v, 1);
  return chr(' ').str(units[u]);
}

}  // namespace cleave::comm_detail
