#include "cleave/optim/grad_norm.h"

#include <vector>

namespace cleave {

double sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t chunk = 1 << 14;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(n_chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * chunk);
    float lane[16] = {};
    int64_t i = c * chunk;
    for (; i + 16 <= end; i += 16)
      for (int k = 0; k < 16; ++k) lane[k] += x[i + k] * x[i + k];
    double s = 0;
    for (int k = 0; k < 16; ++k) s += lane[k];
    for (; i < end; ++i) s += double(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace cleave
