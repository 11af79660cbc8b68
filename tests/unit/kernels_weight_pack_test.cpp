// pack_weight against oneDNN's own reorder, byte for byte: on the layouts oneDNN's matmul picks for
// linear layers (fp32 and bf16, forward and backward_input, shapes with and without padding) and
// on blocked tags given directly.
#include "cleave/kernels/weight_pack.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace cleave::kernels {
namespace {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

struct AlignedBytes {
  explicit AlignedBytes(size_t n) : size(n), p(std::aligned_alloc(64, (n + 63) / 64 * 64)) {
    std::memset(p, 0xAB, size);  // garbage: the padding must be written too
  }
  ~AlignedBytes() { std::free(p); }
  size_t size;
  void* p;
};

std::vector<float> random_weight(int64_t out, int64_t in) {
  std::vector<float> w(size_t(out * in));
  uint64_t s = 88172645463325252ull + uint64_t(out * 131 + in);
  for (auto& e : w) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    e = float(int64_t(s % 2000001) - 1000000) * 1.37e-6f;
  }
  return w;
}

// Packs W into every layout in one call and compares each with oneDNN's reorder.
void expect_same_as_reorder(int64_t out, int64_t in, const std::vector<memory::desc>& wants,
                            const std::vector<bool>& transposed) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  std::vector<float> w = random_weight(out, in);
  std::vector<BlockedLayout> layouts;
  std::vector<std::unique_ptr<AlignedBytes>> ours, theirs;
  std::vector<PackTarget> targets;
  layouts.reserve(wants.size());
  for (size_t i = 0; i < wants.size(); ++i) {
    auto layout = blocked_layout(wants[i]);
    ASSERT_TRUE(layout.has_value()) << "layout " << i << " of " << out << "x" << in;
    layouts.push_back(*layout);
    ours.push_back(std::make_unique<AlignedBytes>(wants[i].get_size()));
    theirs.push_back(std::make_unique<AlignedBytes>(wants[i].get_size()));
    targets.push_back({&layouts.back(), bool(transposed[i]), ours.back()->p, i % 2 == 1});
    memory src(user_weight_desc(out, in, transposed[i]), eng, w.data());
    memory dst(wants[i], eng, theirs.back()->p);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
  }
  pack_weight(w.data(), out, in, targets);
  for (size_t i = 0; i < wants.size(); ++i)
    EXPECT_EQ(std::memcmp(ours[i]->p, theirs[i]->p, wants[i].get_size()), 0)
        << "layout " << i << " of W " << out << "x" << in
        << (transposed[i] ? " transposed" : "");
}

TEST(WeightPack, MatmulLayoutsBothRolesInOnePass) {
  const int64_t shapes[][2] = {{3072, 768}, {768, 2304}, {96, 64},
                               {130, 200},  {50, 37},    {8192, 96}};
  for (dt type : {dt::f32, dt::bf16})
    for (auto& s : shapes)
      for (int64_t N : {64, 1024}) {
        const int64_t out = s[0], in = s[1];
        const PreferredLayouts preferred = preferred_weight_layouts(N, in, out, type == dt::bf16);
        const memory::desc& fwd = preferred.forward;
        const memory::desc& bin = preferred.backward_input;
        std::vector<memory::desc> wants;
        std::vector<bool> transposed;
        if (blocked_layout(fwd)) wants.push_back(fwd), transposed.push_back(true);
        if (blocked_layout(bin)) wants.push_back(bin), transposed.push_back(false);
        // The layouts of a GPT-2 layer are the ones the packer exists for, where oneDNN blocks
        // weights at all (not on an AVX2-only CPU).
        if (out % 64 == 0 && in % 64 == 0 && out >= 768 &&
            packer_writes_layouts(1024, 768, 3072, false)) {
          EXPECT_EQ(wants.size(), 2u) << out << "x" << in << " N " << N;
        }
        expect_same_as_reorder(out, in, wants, transposed);
      }
}

TEST(WeightPack, BlockedTagsWithPadding) {
  const tag tags[] = {tag::BA16a64b, tag::BA16a64b2a, tag::AB16b64a, tag::BA16a16b,
                      tag::AB8b16a2b, tag::BA16a48b};
  for (dt type : {dt::f32, dt::bf16})
    for (tag t : tags)
      for (auto [out, in] : {std::pair<int64_t, int64_t>{70, 33}, {16, 64}, {129, 5}}) {
        memory::desc fwd({in, out}, type, t), bin({out, in}, type, t);
        expect_same_as_reorder(out, in, {fwd, bin}, {true, false});
      }
}

TEST(WeightPack, RejectsWhatItDoesNotHandle) {
  EXPECT_FALSE(blocked_layout(memory::desc({64, 64}, dt::f32, tag::ab)));
  EXPECT_FALSE(blocked_layout(memory::desc({64, 64}, dt::f32, tag::ba)));
  EXPECT_FALSE(blocked_layout(memory::desc({4, 64, 64}, dt::f32, tag::abc)));
  EXPECT_FALSE(blocked_layout(memory::desc({64, 64}, dt::s8, tag::BA16a64b4a)));
}

}  // namespace
}  // namespace cleave::kernels
