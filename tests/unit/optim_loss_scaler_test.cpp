// The dynamic loss scaler's rules: backoff once the hysteresis is used up (and on every overflow
// after that until a growth), growth after growth_interval good steps in a row (which also renews
// the hysteresis), the floor at min, and false for an overflow at min.
#include <gtest/gtest.h>

#include "cleave/optim/loss_scaler.h"

namespace cleave {
namespace {

LossScalerOptions options() {
  LossScalerOptions o;
  o.initial = 1024;
  o.growth_factor = 2;
  o.growth_interval = 3;
  o.backoff_factor = 0.5;
  o.hysteresis = 2;
  o.min = 128;
  return o;
}

TEST(LossScaler, GrowsAfterTheIntervalOfGoodSteps) {
  DynamicLossScaler s(options());
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.state().good_steps, 0);
}

TEST(LossScaler, AnOverflowRestartsTheGrowthCount) {
  DynamicLossScaler s(options());
  s.update(false);
  s.update(false);
  s.update(true);  // the first of two the hysteresis absorbs: no backoff yet
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048);
}

TEST(LossScaler, BacksOffOnceTheHysteresisIsUsedUpAndOnEveryOverflowAfter) {
  DynamicLossScaler s(options());
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);  // a good step does not renew the hysteresis; only a growth does
  s.update(true);
  EXPECT_EQ(s.scale(), 256);
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);  // renewed by the growth
  s.update(true);
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, StopsAtTheFloor) {
  LossScalerOptions o = options();
  o.hysteresis = 1;
  DynamicLossScaler s(o);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 128);
  EXPECT_FALSE(s.update(true));  // nothing smaller is allowed: the caller stops
  EXPECT_EQ(s.scale(), 128);
}

TEST(LossScaler, RestoresItsState) {
  DynamicLossScaler a(options()), b(options());
  a.update(false);
  a.update(true);
  b.restore(a.state());
  for (bool overflow : {false, true, false, false, false, true, true}) {
    EXPECT_EQ(a.update(overflow), b.update(overflow));
    EXPECT_EQ(a.scale(), b.scale());
  }
}

}  // namespace
}  // namespace cleave
