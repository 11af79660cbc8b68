// Helpers of the multi-rank comm tests: the world group, deterministic per-rank inputs whose sums
// are exact in fp32 (so a reference computed in any order matches bitwise), bf16 conversion.
#pragma once
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cleave/comm/group.h"

namespace cleave::test {

extern Group* g_world;  // MPI_COMM_WORLD, created by main() around the tests
inline Group& world() { return *g_world; }

inline uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A multiple of 2^-6 in [-16, 16], exactly representable in bf16 (and fp32). Sums of a few are
// exact in fp32 in any order.
inline float value(int rank, int64_t i) {
  const int64_t k = (i * 7919 + int64_t(rank) * 104729 + 13) % 2047 - 1023;
  return from_bf16(to_bf16(float(k) / 64.0f));
}

// n elements of value(rank, first + i) in the given type, as raw bytes.
inline std::vector<char> make_input(CommType t, int rank, int64_t first, int64_t n) {
  std::vector<char> out(size_t(n) * (t == CommType::f32 ? 4 : 2));
  for (int64_t i = 0; i < n; ++i) {
    const float v = value(rank, first + i);
    if (t == CommType::f32) std::memcpy(out.data() + 4 * i, &v, 4);
    else {
      const uint16_t h = to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Element i of a typed byte buffer as float.
inline float element(CommType t, const std::vector<char>& buf, int64_t i) {
  if (t == CommType::f32) {
    float v;
    std::memcpy(&v, buf.data() + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return from_bf16(h);
}

// The exact sum over ranks of value(r, i), rounded once to the type.
inline float reference_sum(CommType t, int ranks, int64_t i) {
  float s = 0;
  for (int r = 0; r < ranks; ++r) s += value(r, i);
  return t == CommType::f32 ? s : from_bf16(to_bf16(s));
}

inline const char* type_name(CommType t) {
  return t == CommType::f32 ? "f32" : t == CommType::bf16 ? "bf16" : "i64";
}
inline const char* algo_name(CommAlgo a) {
  return a == CommAlgo::ours ? "ours" : a == CommAlgo::mpi ? "mpi" : "fastest";
}

// Compares element by element (bitwise, as floats) and reports the first few mismatches.
template <class Expected>
void expect_elements(CommType t, const std::vector<char>& got, int64_t n, Expected expected,
                     const std::string& what) {
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float g = element(t, got, i), e = expected(i);
    if (std::memcmp(&g, &e, 4) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << e;
      ++bad;
    }
  }
}

}  // namespace cleave::test
