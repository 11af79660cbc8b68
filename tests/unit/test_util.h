// Helpers shared by the unit tests: seeded random inputs, bitwise comparison, a scoped OpenMP
// thread count (results must not depend on it), token positions, an error's message.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <cstring>
#include <random>
#include <vector>

#include "cleave/base/check.h"

namespace cleave::test_util {

// The message of the cleave::Error f throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const cleave::Error& e) {
    return e.what();
  }
  return "(no error)";
}

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

// A fresh folder for the running test (named after it and the process), removed afterwards.
class TestDir {
 public:
  explicit TestDir(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "-" + std::to_string(::getpid()) + "-" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() { std::filesystem::remove_all(path_); }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Position pos_offset + t for token t of each of B sequences of T tokens.
inline std::vector<int32_t> sequence_positions(int64_t B, int64_t T, int64_t pos_offset = 0) {
  std::vector<int32_t> p(size_t(B * T));
  for (int64_t r = 0; r < B * T; r++) p[size_t(r)] = int32_t(pos_offset + r % T);
  return p;
}

// Two sequences of 16 rows: documents restarting at 0 mid-sequence (5, 8 and 3 tokens), then a
// context-parallel rank's zigzag pieces [0..7] ++ [24..31].
inline std::vector<int32_t> restart_and_zigzag_positions() {
  std::vector<int32_t> p;
  for (int t = 0; t < 5; t++) p.push_back(t);
  for (int t = 0; t < 8; t++) p.push_back(t);
  for (int t = 0; t < 3; t++) p.push_back(t);
  for (int t = 0; t < 8; t++) p.push_back(t);
  for (int t = 24; t < 32; t++) p.push_back(t);
  return p;
}

}  // namespace cleave::test_util
