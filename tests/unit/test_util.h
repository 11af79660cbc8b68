// Helpers shared by the unit tests: seeded random inputs, bitwise comparison, and a scoped
// OpenMP thread count (results must not depend on it).
#pragma once
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace cleave::test_util {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = shift + scale * d(gen);
  return v;
}

// Uniform ids in [0, V): tokens or targets.
inline std::vector<int32_t> random_ids(size_t n, int V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(gen);
  return t;
}

inline bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bitwise_equal(a.data(), b.data(), a.size());
}

struct Threads {  // sets the OpenMP thread count for a scope
  int saved;
  explicit Threads(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(saved); }
};

}  // namespace cleave::test_util
