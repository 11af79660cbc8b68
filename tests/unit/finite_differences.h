// The unit tests' gradient check: analytic derivatives against central finite differences.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace cleave {

// Compares analytic[i] with (loss(x[i] + eps) - loss(x[i] - eps)) / 2 eps for `count` entries i
// of x (n of them, spread by a stride prime to n), calling `changed` after each write to x (a
// weight's packed copies must hear of it). Within abs_tol + rel_tol |fd|.
inline void expect_fd(const std::string& what, float* x, const float* analytic, int64_t n,
                      const std::function<double()>& loss, const std::function<void()>& changed,
                      int count = 6, double abs_tol = 2e-3, double rel_tol = 2e-2) {
  const float eps = 1e-2f;
  for (int k = 0; k < count; ++k) {
    const int64_t i = (k * 7919 + 13) % n;
    const float saved = x[i];
    x[i] = saved + eps;
    changed();
    const double up = loss();
    x[i] = saved - eps;
    changed();
    const double down = loss();
    x[i] = saved;
    changed();
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic[i], fd, abs_tol + rel_tol * std::fabs(fd)) << what << "[" << i << "]";
  }
}

}  // namespace cleave
