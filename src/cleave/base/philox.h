// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value is a pure function of
// (key, counter), so any slice of a tensor can be initialised without generating the rest, and any
// layout of the model builds exactly its part of the one model (docs/architecture.md, Determinism).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace cleave {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A 64-bit FNV-1a hash of a name: how a parameter's name joins the key.
uint64_t hash_name(std::string_view name);

// Uniform in (0, 1] and standard normal draws for element `index` of stream (seed, stream).
float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);
float philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace cleave
