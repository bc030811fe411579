#include "server/strategy/dp_mean_aggregator.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;

TEST(DpMeanAggregatorTest, DividesTheSumBySampledClientsAndIgnoresWeights) {
  // No noise (z = 0), so the arithmetic shows: 4 sampled, 2 answered.
  DpMeanAggregator aggregator(3, /*clip_norm=*/1.0, /*noise_multiplier=*/0.0);
  aggregator.BeginStep(4);
  const std::vector<float> a = {1, 2, 3}, b = {3, 2, -1};
  aggregator.Fold(/*weight=*/1000, 1, a);  // a claimed 1000 examples: ignored
  aggregator.Fold(/*weight=*/1, 1, b);
  EXPECT_EQ(aggregator.count(), 2);
  auto delta = aggregator.Finish();
  ASSERT_TRUE(delta.ok());
  EXPECT_THAT(*delta, ElementsAre(1.0, 1.0, 0.5));  // (a + b) / 4
}

TEST(DpMeanAggregatorTest, ResetForgetsTheStep) {
  DpMeanAggregator aggregator(2, 1.0, 0.0);
  aggregator.BeginStep(2);
  aggregator.Fold(1, 1, std::vector<float>{8, 8});
  ASSERT_TRUE(aggregator.Finish().ok());
  aggregator.Reset();
  aggregator.BeginStep(1);
  aggregator.Fold(1, 1, std::vector<float>{1, -1});
  auto delta = aggregator.Finish();
  ASSERT_TRUE(delta.ok());
  EXPECT_THAT(*delta, ElementsAre(1.0, -1.0));
}

TEST(DpMeanAggregatorTest, NoiseOnTheSumHasDeviationZTimesCOverN) {
  // 10 sampled, z = 1.5, C = 2: Delta's noise is N(0, (1.5 * 2 / 10)^2) in
  // every coordinate. One zero update isolates it.
  const size_t n = 200000;
  DpMeanAggregator aggregator(n, /*clip_norm=*/2.0, /*noise_multiplier=*/1.5);
  EXPECT_DOUBLE_EQ(aggregator.noise_stddev(), 3.0);
  aggregator.BeginStep(10);
  aggregator.Fold(1, 1, std::vector<float>(n, 0.0f));
  auto delta = aggregator.Finish();
  ASSERT_TRUE(delta.ok());
  double sum = 0, squares = 0;
  for (double v : *delta) sum += v;
  const double mean = sum / n;
  for (double v : *delta) squares += (v - mean) * (v - mean);
  const double s = 0.3;
  EXPECT_NEAR(mean, 0.0, 6 * s / std::sqrt(n));
  EXPECT_NEAR(squares / (n - 1), s * s, 6 * s * s * std::sqrt(2.0 / n));
  // Finish twice returns the same aggregate: the noise is drawn once.
  auto again = aggregator.Finish();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), delta->data());
  EXPECT_EQ((*again)[0], (*delta)[0]);
}

}  // namespace
}  // namespace fedlearn
