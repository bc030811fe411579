#include "server/strategy/dp_mean_aggregator.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;

DpParams Params(double clip_norm, double noise_multiplier) {
  DpParams p;
  p.clip_norm = clip_norm;
  p.noise_multiplier = noise_multiplier;
  return p;
}

TEST(DpMeanAggregatorTest, DividesTheSumBySampledClientsAndIgnoresWeights) {
  // No noise (z = 0), so the arithmetic shows: 4 sampled, 2 answered.
  DpMeanAggregator aggregator(3, Params(/*clip_norm=*/1.0, /*z=*/0.0));
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
  DpMeanAggregator aggregator(2, Params(1.0, 0.0));
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
  DpMeanAggregator aggregator(n, Params(/*clip_norm=*/2.0, /*z=*/1.5));
  EXPECT_DOUBLE_EQ(Params(2.0, 1.5).SumNoiseMultiplier(10), 1.5);
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

TEST(DpMeanAggregatorTest, StageClipsToCAndSaysWhetherTheUpdateWasWithin) {
  DpMeanAggregator aggregator(2, Params(5.0, 1.0));
  std::vector<float> big = {30, 40};  // norm 50
  auto staged = aggregator.Stage(absl::MakeSpan(big));
  ASSERT_TRUE(staged.ok());
  EXPECT_FALSE(staged->within_clip);
  EXPECT_THAT(big, ElementsAre(3.0f, 4.0f));
  std::vector<float> small = {0.3f, 0.4f};
  staged = aggregator.Stage(absl::MakeSpan(small));
  ASSERT_TRUE(staged.ok());
  EXPECT_TRUE(staged->within_clip);
  EXPECT_THAT(small, ElementsAre(0.3f, 0.4f));
}

TEST(DpMeanAggregatorTest, AdaptiveClippingSplitsTheNoiseAsAndrewEtAl) {
  DpParams p = Params(1.0, 1.0);
  p.target_quantile = 0.5;
  p.clip_learning_rate = 0.2;
  // sigma_b by default n / 20, at least z.
  EXPECT_DOUBLE_EQ(p.CountStddev(100), 5.0);
  EXPECT_DOUBLE_EQ(p.CountStddev(10), 1.0);
  DpParams given = p;
  given.clipped_count_stddev = 2.0;
  EXPECT_DOUBLE_EQ(given.CountStddev(10), 2.0);
  EXPECT_FALSE(DpParams::CountStddevFits(0.5, 1.0));
  EXPECT_TRUE(DpParams::CountStddevFits(0.51, 1.0));
  // The two releases, the clipped sum (sensitivity C, noise z_sum C) and the
  // centred count (sensitivity 1/2, noise sigma_b), are one Gaussian mechanism
  // whose multiplier is 1 / |sensitivity / noise|_2 over the two: it must be z.
  for (const DpParams& q : {p, given}) {
    for (int n : {10, 100, 1000}) {
      const double c = q.clip_norm;
      const double z_sum = q.SumNoiseMultiplier(n);
      const double ratio_sum = c / (z_sum * c);
      const double ratio_count = 0.5 / q.CountStddev(n);
      EXPECT_NEAR(1 / std::hypot(ratio_sum, ratio_count), q.noise_multiplier,
                  1e-12)
          << n;
    }
  }
  // Fixed C: the sum takes the whole multiplier.
  EXPECT_DOUBLE_EQ(Params(1.0, 1.0).SumNoiseMultiplier(10), 1.0);
}

// Stages and folds one round of updates of the given norms (in 2-d), then
// finishes it; returns the C the round clipped to.
double Round(DpMeanAggregator& aggregator, const std::vector<double>& norms) {
  aggregator.BeginStep(static_cast<int>(norms.size()));
  for (double r : norms) {
    std::vector<float> update = {static_cast<float>(r * 0.6),
                                 static_cast<float>(r * 0.8)};
    auto staged = aggregator.Stage(absl::MakeSpan(update));
    EXPECT_TRUE(staged.ok());
    aggregator.FoldStaged(1, 1, update, *std::move(staged));
  }
  EXPECT_TRUE(aggregator.Finish().ok());
  aggregator.Reset();
  return aggregator.finished_clip_norm();
}

TEST(DpMeanAggregatorTest, AdaptiveClipMovesGeometricallyToTheQuantile) {
  // Next to no noise (z and sigma_b 1e-6), so the rule shows: 3 of 4 within
  // C = 1 against a target of 0.5: C' = exp(-0.2 (0.75 - 0.5)).
  DpParams p = Params(1.0, 1e-6);
  p.target_quantile = 0.5;
  p.clip_learning_rate = 0.2;
  p.clipped_count_stddev = 1e-6;
  DpMeanAggregator aggregator(2, p);
  EXPECT_EQ(Round(aggregator, {0.5, 0.7, 0.9, 3.0}), 1.0);
  EXPECT_NEAR(aggregator.clip_norm(), std::exp(-0.05), 1e-6);
  // 2 of 4 sampled answer, both within C = exp(-0.05): the count is centred,
  // (2 - 2/2) / 4 + 1/2 = 0.75, so C moves as above (an uncentred 2/4 would
  // leave it where it is).
  const double before = aggregator.clip_norm();
  aggregator.BeginStep(4);
  for (double r : {0.1, 0.2}) {
    std::vector<float> update = {static_cast<float>(r), 0.0f};
    auto staged = aggregator.Stage(absl::MakeSpan(update));
    ASSERT_TRUE(staged.ok());
    aggregator.FoldStaged(1, 1, update, *std::move(staged));
  }
  ASSERT_TRUE(aggregator.Finish().ok());
  aggregator.Reset();
  EXPECT_NEAR(aggregator.clip_norm(), before * std::exp(-0.05), 1e-6);
  // Rounds of 100 norms 0.1, 0.2, ..., 10: C settles at their median, where
  // half are within it (5.0 <= C < 5.1).
  std::vector<double> norms;
  for (int i = 1; i <= 100; ++i) norms.push_back(0.1 * i);
  for (int r = 0; r < 300; ++r) Round(aggregator, norms);
  EXPECT_GT(aggregator.clip_norm(), 4.9);
  EXPECT_LT(aggregator.clip_norm(), 5.2);
  // A restored C is the next round's.
  aggregator.RestoreClipNorm(2.5);
  EXPECT_EQ(Round(aggregator, {1.0}), 2.5);
}

}  // namespace
}  // namespace fedlearn
