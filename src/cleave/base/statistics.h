// Order statistics of measured times, for the benchmarks of every concern.
#pragma once
#include <algorithm>
#include <vector>

namespace cleave {

// The q-quantile (q in [0, 1]) of `values`: the sorted element at floor(q (n - 1)), the lower of
// the two a linear interpolation would blend (so q = 0.5 of an even count is the lower middle,
// where median() takes the mean of the two); 0 for none.
inline double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[size_t(std::clamp(q, 0.0, 1.0) * double(values.size() - 1))];
}

// The middle value, or the mean of the middle two where their count is even; 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace cleave
