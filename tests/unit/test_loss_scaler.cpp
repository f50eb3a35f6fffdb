#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/optim/loss_scaler.hpp"

using namespace shardlm;

TEST(LossScaler, OverflowSkipsTheStepAndBacksOff) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_FALSE(scaler.update(false));  // forced overflow
  EXPECT_EQ(scaler.scale(), 32768.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 16384.0);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 16384.0);
}

TEST(LossScaler, GrowsAfterAnIntervalOfGoodStepsOnly) {
  LossScaler scaler({1024.0, 2.0, 0.5, 3, 1.0});
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(scaler.update(true));  // third good step in a row
  EXPECT_EQ(scaler.scale(), 2048.0);
  scaler.update(true);
  scaler.update(false);  // an overflow resets the run of good steps
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1024.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2048.0);
}

TEST(LossScaler, NeverBelowMinimumAndStateRoundTrips) {
  LossScaler scaler({4.0, 2.0, 0.5, 10, 1.0});
  for (int i = 0; i < 5; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1.0);
  LossScaler restored({4.0, 2.0, 0.5, 10, 1.0});
  restored.load_json(scaler.to_json());
  EXPECT_EQ(restored.scale(), scaler.scale());
  EXPECT_EQ(restored.skipped_steps(), 5);
  EXPECT_THROW(restored.load_json(nlohmann::json::object()), Error);
  EXPECT_THROW(LossScaler({1.0, 2.0, 1.5, 10, 1.0}), Error);
}
