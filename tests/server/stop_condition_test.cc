#include "server/stop_condition.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::Optional;

TEST(StopConditionTest, ConvergesWhenTheLossImprovesByLessThanTheThreshold) {
  StopCondition stop(50, 0.01);
  StopCondition::Verdict v = stop.Observe(1, 2.0);
  EXPECT_FALSE(v.stop);
  EXPECT_EQ(v.improvement, std::nullopt);  // nothing to compare with
  v = stop.Observe(2, 1.0);
  EXPECT_FALSE(v.stop);
  EXPECT_THAT(v.improvement, Optional(0.5));
  v = stop.Observe(3, 0.995);  // 0.5% better
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.reason, "converged");
  EXPECT_THAT(stop.previous_loss(), Optional(0.995));
}

TEST(StopConditionTest, StopsAtMaxRoundsWhateverTheLoss) {
  StopCondition stop(3, -std::numeric_limits<double>::infinity());
  EXPECT_FALSE(stop.Observe(1, 3.0).stop);
  EXPECT_FALSE(stop.Observe(2, 9.0).stop);  // rising: -inf never converges
  StopCondition::Verdict v = stop.Observe(3, 27.0);
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.reason, "max_rounds");
}

TEST(StopConditionTest, AVersionWithoutALossOnlyCountsTowardsMaxRounds) {
  StopCondition stop(2, 0.5);
  EXPECT_FALSE(stop.Observe(1, std::nullopt).stop);
  EXPECT_EQ(stop.previous_loss(), std::nullopt);
  EXPECT_EQ(stop.Observe(2, std::nullopt).reason, "max_rounds");
}

TEST(StopConditionTest, ARestoredLossIsComparedWith) {
  StopCondition stop(50, 0.0);
  stop.Restore(1.0);
  StopCondition::Verdict v = stop.Observe(7, 1.5);
  EXPECT_TRUE(v.stop);  // a rising loss at threshold 0
  EXPECT_THAT(v.improvement, Optional(-0.5));
}

}  // namespace
}  // namespace fedlearn
