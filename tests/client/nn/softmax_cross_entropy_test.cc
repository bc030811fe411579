#include "client/nn/softmax_cross_entropy.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace fedlearn::nn {
namespace {

// Two samples of three classes, one column each.
//   sample 0: logits (1, 2, 3), label 2: loss = log(e + e^2 + e^3) - 3
//             = log(1 + e^-1 + e^-2) = log(1.50321472) = 0.40760596; argmax 2:
//             correct.
//   sample 1: logits (2, 0, -1), label 1: loss = log(e^2 + 1 + e^-1) - 0
//             = log(8.75693554) = 2.16984602; argmax 0: wrong.
const std::vector<float> kLogits = {1, 2, 3, 2, 0, -1};
const std::vector<uint8_t> kLabels = {2, 1};

TEST(SoftmaxCrossEntropyTest, LossAndAccuracyByHand) {
  const LossResult r =
      SoftmaxCrossEntropy(kLogits.data(), kLabels.data(), 3, 2, nullptr);
  EXPECT_NEAR(r.loss_sum, 0.40760596444438013 + 2.1698460195562856, 1e-6);
  EXPECT_EQ(r.correct, 1);
}

TEST(SoftmaxCrossEntropyTest, GradientByHand) {
  std::vector<float> d(6);
  SoftmaxCrossEntropy(kLogits.data(), kLabels.data(), 3, 2, d.data());
  // (softmax - onehot) / batch, batch 2.
  // softmax(1, 2, 3) = (0.09003057, 0.24472847, 0.66524096)
  // softmax(2, 0, -1) = (0.84379473, 0.11419520, 0.04201007)
  const std::vector<double> want = {0.09003057 / 2,       0.24472847 / 2,
                                    (0.66524096 - 1) / 2, 0.84379473 / 2,
                                    (0.11419520 - 1) / 2, 0.04201007 / 2};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferences) {
  const int classes = 10, batch = 4;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-3, 3);
  std::vector<float> logits(classes * batch);
  for (float& z : logits) z = dist(rng);
  const std::vector<uint8_t> labels = {3, 0, 9, 3};
  std::vector<float> d(logits.size());
  SoftmaxCrossEntropy(logits.data(), labels.data(), classes, batch, d.data());

  const auto mean_loss = [&] {
    return SoftmaxCrossEntropy(logits.data(), labels.data(), classes, batch,
                               nullptr)
               .loss_sum /
           batch;
  };
  for (size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = saved + 1e-2f;
    const float up = logits[i];
    const double l_up = mean_loss();
    logits[i] = saved - 1e-2f;
    const float down = logits[i];
    const double l_down = mean_loss();
    logits[i] = saved;
    const double numerical = (l_up - l_down) / (double{up} - double{down});
    EXPECT_NEAR(d[i], numerical, 1e-3 * std::abs(numerical) + 1e-6) << i;
  }
  // Each column of the gradient sums to zero (softmax sums to one).
  for (int b = 0; b < batch; ++b) {
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += d[b * classes + c];
    EXPECT_NEAR(sum, 0, 1e-6);
  }
}

TEST(SoftmaxCrossEntropyTest, StableForLargeLogits) {
  // (1000, 0, -1000) label 0: loss = log(1 + e^-1000 + e^-2000) ~ 0.
  // (1000, 0, -1000) label 1: loss ~ 1000.
  // (1000, 1000, -1000) label 1: loss = log 2 (and a tie for the argmax).
  // (-1000, -1000, -999) label 2: loss = log(1 + 2e^-1) = 0.55144471.
  const std::vector<float> logits = {1000, 0,    -1000, 1000,  0,     -1000,
                                     1000, 1000, -1000, -1000, -1000, -999};
  const std::vector<uint8_t> labels = {0, 1, 1, 2};
  std::vector<float> d(12);
  const LossResult r =
      SoftmaxCrossEntropy(logits.data(), labels.data(), 3, 4, d.data());
  ASSERT_TRUE(std::isfinite(r.loss_sum));
  EXPECT_NEAR(r.loss_sum,
              0 + 1000 + std::log(2.0) + std::log(1 + 2 * std::exp(-1.0)),
              1e-4);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(std::isfinite(d[i])) << i;
  EXPECT_NEAR(d[0], 0, 1e-7);  // p = 1 for the label: nothing to learn
  EXPECT_NEAR(d[3], 1.0 / 4, 1e-7);
  EXPECT_NEAR(d[4], -1.0 / 4, 1e-7);
  EXPECT_NEAR(d[6], 0.5 / 4, 1e-7);
  EXPECT_NEAR(d[7], -0.5 / 4, 1e-7);
  // Sample 0 is right; 1 is wrong; 3 is right. Sample 2 ties; it does not count
  // here.
  EXPECT_GE(r.correct, 2);
  EXPECT_LE(r.correct, 3);
}

TEST(SoftmaxCrossEntropyTest, UniformLogitsGiveLogClasses) {
  const std::vector<float> logits(10 * 3, 0.25f);
  const std::vector<uint8_t> labels = {0, 5, 9};
  const LossResult r =
      SoftmaxCrossEntropy(logits.data(), labels.data(), 10, 3, nullptr);
  EXPECT_NEAR(r.loss_sum, 3 * std::log(10.0), 1e-9);
}

}  // namespace
}  // namespace fedlearn::nn
