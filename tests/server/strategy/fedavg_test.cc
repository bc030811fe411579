// FedAvg as the strategy composes it: WeightedMeanAggregator, then server SGD
// at learning rate 1. The expected values are the seed's
// WeightedMeanAggregator's, to the bit: the redesign changed structure, not
// numbers.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/strategy/aggregator.h"
#include "server/strategy/server_optimizer.h"
#include "server/weighted_mean.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;

// Distance in units in the last place between two finite floats of the same
// sign.
int64_t UlpDistance(float a, float b) {
  int32_t ia;
  int32_t ib;
  std::memcpy(&ia, &a, sizeof(ia));
  std::memcpy(&ib, &b, sizeof(ib));
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

// FedAvg's step: global + the weighted mean, through server SGD at rate 1.
void ApplyMean(WeightedMeanAggregator& acc, absl::Span<const float> global,
               absl::Span<float> out) {
  SgdServerOptimizer sgd(global.size(), 1.0, 0.0);
  sgd.Step(*acc.Finish(), global, out);
}

// Three clients with 1, 2 and 3 examples:
//   global   =  1.0   -2.0    0.5   0.0    3.0
//   delta_1  =  0.5    1.0   -1.0   0.25  -6.0   (n = 1)
//   delta_2  =  1.0   -0.5    2.0   0.0    0.0   (n = 2)
//   delta_3  = -0.5    0.25   0.0   1.0    2.0   (n = 3)
//   sum n*d  =  1.0    0.75   3.0   3.25   0.0
//   / 6      =  1/6    0.125  0.5   13/24  0.0
//   result   =  7/6   -1.875  1.0   13/24  3.0
class FedAvgExampleTest : public ::testing::Test {
 protected:
  FedAvgExampleTest() : acc_(5) {
    acc_.Fold(1, 1.0, d1_);
    acc_.Fold(2, 1.0, d2_);
    acc_.Fold(3, 1.0, d3_);
  }

  void ExpectExampleResult(absl::Span<const float> out) {
    ASSERT_EQ(out.size(), 5u);
    EXPECT_EQ(out[0], 1.16666663f);  // 7/6 rounded to float
    EXPECT_EQ(out[1], -1.875f);
    EXPECT_EQ(out[2], 1.0f);
    EXPECT_EQ(out[3], 0.541666687f);  // 13/24 rounded to float
    EXPECT_EQ(out[4], 3.0f);
  }

  const std::vector<float> global_ = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f};
  const std::vector<float> d1_ = {0.5f, 1.0f, -1.0f, 0.25f, -6.0f};
  const std::vector<float> d2_ = {1.0f, -0.5f, 2.0f, 0.0f, 0.0f};
  const std::vector<float> d3_ = {-0.5f, 0.25f, 0.0f, 1.0f, 2.0f};
  WeightedMeanAggregator acc_;
};

TEST_F(FedAvgExampleTest, WeightedMeanOfThreeClients) {
  EXPECT_EQ(acc_.count(), 3);
  EXPECT_EQ(acc_.total_weight(), 6.0);
  std::vector<float> out(5, -99.0f);
  ApplyMean(acc_, global_, absl::MakeSpan(out));
  ExpectExampleResult(out);
}

TEST_F(FedAvgExampleTest, OrderOfFoldsDoesNotMatter) {
  WeightedMeanAggregator reversed(5);
  reversed.Fold(3, 1.0, d3_);
  reversed.Fold(2, 1.0, d2_);
  reversed.Fold(1, 1.0, d1_);
  std::vector<float> out(5);
  ApplyMean(reversed, global_, absl::MakeSpan(out));
  ExpectExampleResult(out);
}

TEST_F(FedAvgExampleTest, FinishIsIdempotent) {
  std::vector<float> first(5);
  std::vector<float> second(5);
  ApplyMean(acc_, global_, absl::MakeSpan(first));
  ApplyMean(acc_, global_, absl::MakeSpan(second));
  EXPECT_EQ(first, second);
  EXPECT_EQ(acc_.count(), 3);
  EXPECT_EQ(acc_.total_weight(), 6.0);
  EXPECT_EQ(global_, std::vector<float>({1.0f, -2.0f, 0.5f, 0.0f, 3.0f}));
}

TEST_F(FedAvgExampleTest, ScaleMultipliesTheUpdateNotItsWeight) {
  // Async mode's staleness discount: sum(w * s * d) / sum(w). Two updates of
  // weight 1, the second at scale 0.5: (d + 0.5 d') / 2.
  WeightedMeanAggregator acc(2);
  acc.Fold(1, 1.0, std::vector<float>{2.0f, -4.0f});
  acc.Fold(1, 0.5, std::vector<float>{4.0f, 8.0f});
  EXPECT_EQ(acc.total_weight(), 2.0);
  const absl::Span<const double> delta = *acc.Finish();
  EXPECT_THAT(std::vector<double>(delta.begin(), delta.end()),
              ElementsAre(2.0, 0.0));
}

TEST_F(FedAvgExampleTest, ResetForgetsEveryUpdate) {
  acc_.Reset();
  EXPECT_EQ(acc_.count(), 0);
  EXPECT_EQ(acc_.total_weight(), 0.0);
  // One update with 5 examples: the mean is that update.
  acc_.Fold(5, 1.0, std::vector<float>{0.5f, 0.5f, -0.25f, 8.0f, -3.0f});
  EXPECT_EQ(acc_.count(), 1);
  EXPECT_EQ(acc_.total_weight(), 5.0);
  std::vector<float> out(5);
  ApplyMean(acc_, global_, absl::MakeSpan(out));
  EXPECT_THAT(out, ElementsAre(1.5f, -1.5f, 0.25f, 8.0f, 0.0f));
}

TEST(WeightedMeanAggregatorTest, FractionalWeights) {
  WeightedMeanAggregator acc(2);
  acc.Fold(0.5, 1.0, std::vector<float>{4.0f, 1.0f});
  acc.Fold(1.5, 1.0, std::vector<float>{-4.0f, 1.0f});
  EXPECT_EQ(acc.total_weight(), 2.0);
  std::vector<float> out(2);
  ApplyMean(acc, std::vector<float>{10.0f, 10.0f}, absl::MakeSpan(out));
  // (0.5 * 4 - 1.5 * 4) / 2 = -2; (0.5 + 1.5) / 2 = 1.
  EXPECT_THAT(out, ElementsAre(8.0f, 11.0f));
}

TEST(WeightedMeanAggregatorTest, LongOddLengthVector) {
  // An odd length so that a vectorised loop's tail is covered. With a_i = i (n
  // = 1), b_i = 2i (n = 3) and global_i = -i: -i + (i + 6i) / 4 = 0.75 i, exact
  // in float.
  const size_t n = 1003;
  std::vector<float> a(n);
  std::vector<float> b(n);
  std::vector<float> global(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 2.0f * static_cast<float>(i);
    global[i] = -static_cast<float>(i);
  }
  WeightedMeanAggregator acc(n);
  acc.Fold(1, 1.0, a);
  acc.Fold(3, 1.0, b);
  std::vector<float> out(n);
  ApplyMean(acc, global, absl::MakeSpan(out));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], 0.75f * static_cast<float>(i)) << i;
  }
}

// The sums are kept in double: a thousand updates of 0.1f average to 0.1f
// exactly, so the result is global + 0.1f computed in double and rounded once.
TEST(WeightedMeanAggregatorTest, ThousandUpdatesKeepFloatPrecision) {
  const std::vector<float> global = {0.0f,  1.0f,     -0.7f,
                                     1e-3f, 123.456f, -50.0f};
  const size_t n = global.size();
  WeightedMeanAggregator acc(n);
  const std::vector<float> update(n, 0.1f);
  for (int i = 0; i < 1000; ++i) acc.Fold(1, 1.0, update);
  EXPECT_EQ(acc.count(), 1000);
  EXPECT_EQ(acc.total_weight(), 1000.0);
  std::vector<float> out(n);
  ApplyMean(acc, global, absl::MakeSpan(out));
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(static_cast<double>(global[i]) +
                                          static_cast<double>(0.1f));
    EXPECT_LE(UlpDistance(out[i], want), 1)
        << "global " << global[i] << ": got " << out[i] << ", want " << want;
  }
  EXPECT_EQ(out[1], 1.10000002f);

  // The test can tell: summing the same updates in float lands 8 ulps away
  // at 1.1.
  float float_sum = 0;
  for (int i = 0; i < 1000; ++i) float_sum += 0.1f;
  EXPECT_GT(UlpDistance(1.0f + float_sum / 1000, 1.10000002f), 1);
}

TEST(WeightedMeanAggregatorTest,
     IdenticalUpdatesAverageToThemselvesWhateverTheWeights) {
  const std::vector<float> global = {0.0f, 2.5f, -0.3f};
  const std::vector<float> update = {0.1f, -0.7f, 1e-5f};
  WeightedMeanAggregator acc(3);
  double total = 0;
  for (int i = 0; i < 1000; ++i) {
    const double weight = 1 + i % 10;  // 1..10 examples
    acc.Fold(weight, 1.0, update);
    total += weight;
  }
  EXPECT_EQ(acc.total_weight(), total);
  std::vector<float> out(3);
  ApplyMean(acc, global, absl::MakeSpan(out));
  for (size_t i = 0; i < 3; ++i) {
    const float want = static_cast<float>(static_cast<double>(global[i]) +
                                          static_cast<double>(update[i]));
    EXPECT_LE(UlpDistance(out[i], want), 1) << i;
  }
}

TEST(WeightedMeanTest, EmptyIsZero) {
  WeightedMean mean;
  EXPECT_EQ(mean.value(), 0.0);
  EXPECT_EQ(mean.weight(), 0.0);
}

TEST(WeightedMeanTest, WeighsEachValue) {
  WeightedMean loss;
  loss.Add(2.0, 10);
  loss.Add(1.0, 30);
  // (2 * 10 + 1 * 30) / 40
  EXPECT_EQ(loss.value(), 1.25);
  EXPECT_EQ(loss.weight(), 40.0);

  WeightedMean accuracy;
  accuracy.Add(0.5, 1);
  accuracy.Add(0.8, 3);
  // (0.5 + 2.4) / 4
  EXPECT_DOUBLE_EQ(accuracy.value(), 0.725);
  EXPECT_EQ(accuracy.weight(), 4.0);
}

}  // namespace
}  // namespace fedlearn
