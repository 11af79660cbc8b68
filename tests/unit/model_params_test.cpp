// The parameter store: placements map a rank's local tensor onto the global one (its init and its
// checkpoint boxes), groups and units lay out the flat buffers, and the one way to say a weight
// changed (versions) makes every packed copy follow, lazily, at once on a release, and band by
// band as an optimizer writes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cleave/kernels/weight_pack.h"
#include "cleave/model/layers.h"
#include "cleave/model/params.h"
#include "cleave/model/transformer.h"
#include "test_util.h"

namespace cleave {
namespace {

TEST(Placement, FusedRowsAndPaddingMapToTheGlobalTensor) {
  // Rank 1 of 2 of a [q | k | v] weight with 4 q rows, 2 k rows, 2 v rows globally, 3 columns,
  // and one padding row.
  const Placement p = shard_rows({8, 3}, {{0, 2, 2}, {2, 5, 1}, {3, 7, 1}});
  const std::vector<int64_t> local = {5, 3};
  EXPECT_EQ(global_index(p, local, 0), 2 * 3);      // local row 0 is global q row 2
  EXPECT_EQ(global_index(p, local, 2 * 3 + 1), 5 * 3 + 1);  // local row 2 is global k row 5
  EXPECT_EQ(global_index(p, local, 3 * 3 + 2), 7 * 3 + 2);  // local row 3 is global v row 7
  EXPECT_EQ(global_index(p, local, 4 * 3), -1);     // padding
  // A ZeRO-style flat range [4, 11) of the local tensor: the end of the q box and the k box.
  const std::vector<GlobalBox> boxes = global_boxes(p, local, 4, 11);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].offset, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(boxes[0].box_begin, 4);
  EXPECT_EQ(boxes[0].box_end, 6);
  EXPECT_EQ(boxes[1].offset, (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(boxes[1].box_end, 3);
  EXPECT_EQ(boxes[2].offset, (std::vector<int64_t>{7, 0}));
  EXPECT_EQ(boxes[2].box_end, 2);
  EXPECT_EQ(boxes[2].local_begin, 9);

  const Placement cols = shard_cols({4, 6}, 3, 3);
  EXPECT_EQ(global_index(cols, {4, 3}, 3 * 1 + 2), 1 * 6 + 5);
}

TEST(Placement, EachRankInitialisesExactlyItsSliceOfTheOneTensor) {
  ParamStore whole;
  whole.add("w", {6, 4}, Init::normal, 0.5f);
  whole.allocate(11);
  for (int rank = 0; rank < 2; ++rank) {
    ParamStore part;  // rows rank*3 .. +3, then a padding row
    part.add("w", {4, 4}, Init::normal, 0.5f, shard_rows({6, 4}, {{0, rank * 3, 3}}));
    part.allocate(11);
    for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(part.value(0)[i], whole.value(0)[rank * 12 + i]);
    for (int64_t i = 12; i < 16; ++i) EXPECT_EQ(part.value(0)[i], 0.0f) << "padding " << i;
  }
}

// Every mesh axis a tensor is split on or its gradient is a pending sum over is in its
// placement: tp for the split linears and the vocabulary, kv_replicas for a replicated kv head's
// rows, tp for the norms whose rows sequence parallelism splits; nothing at tp = 1.
TEST(Placement, RecordsEveryAxisOfEachTensor) {
  ModelConfig c;
  c.family = Family::llama;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_hidden = 64;
  c.max_seq_len = 16;
  c.tie_embeddings = false;
  using Axes = std::vector<std::string>;
  auto axes_of = [](const Transformer& m, const std::string& name) {
    return m.params().tensor(m.params().find(name)).placement.axes();
  };
  const auto sp = Transformer::planned(c, 4, true);
  EXPECT_EQ(axes_of(*sp, "blocks.0.attn.qkv.weight"), (Axes{"tp", "kv_replicas"}));
  EXPECT_EQ(axes_of(*sp, "blocks.0.attn.out.weight"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*sp, "blocks.0.mlp.fc.weight"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*sp, "blocks.0.norm1.weight"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*sp, "final_norm.weight"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*sp, "embed.wte"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*sp, "lm_head.weight"), (Axes{"tp"}));
  const auto split_kv = Transformer::planned(c, 2, false);
  EXPECT_EQ(axes_of(*split_kv, "blocks.0.attn.qkv.weight"), (Axes{"tp"}));
  EXPECT_EQ(axes_of(*split_kv, "blocks.0.norm1.weight"), Axes{});
  const auto whole = Transformer::planned(c, 1, false);
  for (const ParamTensor& t : whole->params().tensors())
    EXPECT_EQ(t.placement.axes(), Axes{}) << t.name;
}

TEST(ParamStore, GroupsAndUnitsHaveTheirOwnPaddedRegions) {
  ParamStore s;
  const int experts = s.add_group("experts");
  s.begin_unit();
  s.add("a", {5}, Init::ones);
  s.add("e0", {20}, Init::ones, 0.0f, {}, experts);
  s.begin_unit();
  s.add("b", {40}, Init::ones);
  s.allocate(1, 64);
  EXPECT_EQ(s.unit_bounds(0), (std::vector<int64_t>{0, 64, 128}));
  EXPECT_EQ(s.unit_bounds(experts), (std::vector<int64_t>{128, 192, 192}));
  EXPECT_EQ(s.tensor(s.find("b")).offset, 64);
  EXPECT_EQ(s.tensor(s.find("e0")).offset, 128);
  EXPECT_EQ(s.total(), 192);
}

// One linear in a store: its output for input x.
struct OneLinear {
  ParamStore store;
  Linear linear{store, "l", 32, 48, false, 0.5f, Precision::fp32};
  std::vector<float> x = test_util::randn(4 * 32, 3), y = std::vector<float>(4 * 48);
  OneLinear() {
    store.allocate(5);
    linear.bind(store);
  }
  std::vector<float> out() {
    linear.forward(y.data(), x.data(), 4);
    return y;
  }
  float* w() { return store.value(0); }
};

TEST(WeightVersions, PackedCopiesFollowTheStoreVersion) {
  OneLinear a;
  const std::vector<float> before = a.out();
  for (int64_t i = 0; i < 48 * 32; ++i) a.w()[i] *= -1.0f;
  a.store.wrote(0, a.store.total());
  const std::vector<float> after = a.out();
  for (size_t i = 0; i < after.size(); ++i) ASSERT_NEAR(after[i], -before[i], 1e-4f) << i;
  // A release frees the copies; the next product packs the current values.
  a.store.released(0, a.store.total());
  for (int64_t i = 0; i < 48 * 32; ++i) a.w()[i] *= -1.0f;
  const std::vector<float> again = a.out();
  for (size_t i = 0; i < again.size(); ++i) ASSERT_NEAR(again[i], before[i], 1e-4f) << i;
}

TEST(WeightVersions, BandWritesPackLikeALaterProduct) {
  OneLinear lazy, banded;
  lazy.out();
  banded.out();  // both hold packed copies now
  auto write = [](float* w, int64_t r0, int64_t r1) {
    for (int64_t i = r0 * 32; i < r1 * 32; ++i) w[i] = 0.25f * w[i] + 0.01f * float(i % 7);
  };
  write(lazy.w(), 0, 48);
  lazy.store.wrote(0, lazy.store.total());
  if (!kernels::packer_writes_layouts(4, 32, 48, false))
    GTEST_SKIP() << "oneDNN reads this CPU's weights in no layout cleave's packer writes";
  const int64_t band = banded.store.begin_band_writes(0);
  ASSERT_GT(band, 0);
  for (int64_t r = 0; r < 48; r += band) {
    write(banded.w(), r, std::min<int64_t>(48, r + band));
    banded.store.wrote_rows(0, r, std::min<int64_t>(48, r + band));
  }
  banded.store.end_band_writes();
  const std::vector<float> a = lazy.out(), b = banded.out();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace cleave
