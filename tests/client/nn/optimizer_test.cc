#include "client/nn/optimizer.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn::nn {
namespace {

using ::testing::HasSubstr;

// Every optimizer starts from the same weights and sees the same two gradients.
const std::vector<float> kWeights = {1.0f, -2.0f, 0.5f};
const std::vector<float> kGrad1 = {0.5f, -1.0f, 2.0f};
const std::vector<float> kGrad2 = {0.25f, 1.0f, -1.0f};

std::unique_ptr<Optimizer> Make(const char* name, float lr) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(name, lr, 3);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

// Runs the two steps, checking the weights after each against `after1` and
// `after2`.
void ExpectTwoSteps(const char* name, float lr,
                    const std::vector<double>& after1,
                    const std::vector<double>& after2) {
  std::unique_ptr<Optimizer> opt = Make(name, lr);
  ASSERT_NE(opt, nullptr);
  std::vector<float> w = kWeights;
  opt->Step(absl::MakeSpan(w), kGrad1);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(w[i], after1[i], 1e-6) << name << " step 1, " << i;
  opt->Step(absl::MakeSpan(w), kGrad2);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(w[i], after2[i], 1e-6) << name << " step 2, " << i;
}

TEST(OptimizerTest, Sgd) {
  // w -= 0.1 g.
  // step 1: (1 - 0.05, -2 + 0.1, 0.5 - 0.2)    = (0.95, -1.9, 0.3)
  // step 2: (0.95 - 0.025, -1.9 - 0.1, 0.3 + 0.1) = (0.925, -2.0, 0.4)
  ExpectTwoSteps("sgd", 0.1f, {0.95, -1.9, 0.3}, {0.925, -2.0, 0.4});
}

TEST(OptimizerTest, Momentum) {
  // v = 0.9 v - 0.1 g; w += v.
  // step 1: v = (-0.05, 0.1, -0.2); w = (0.95, -1.9, 0.3)
  // step 2: v = (-0.045 - 0.025, 0.09 - 0.1, -0.18 + 0.1) = (-0.07, -0.01,
  // -0.08);
  //         w = (0.88, -1.91, 0.22)
  ExpectTwoSteps("momentum", 0.1f, {0.95, -1.9, 0.3}, {0.88, -1.91, 0.22});
}

TEST(OptimizerTest, Adadelta) {
  // rho 0.95, eps 1e-7, lr 1; a = b = 0 at first.
  //   a = 0.95 a + 0.05 g^2;  d = g sqrt(b + eps) / sqrt(a + eps);
  //   b = 0.95 b + 0.05 d^2;  w -= d.
  // step 1, element 0 (g = 0.5): a = 0.0125; d = 0.5 * sqrt(1e-7) /
  // sqrt(0.0125001)
  //   = 0.5 * 3.16227766e-4 / 0.111803846 = 1.41420791e-3; b = 0.05 d^2
  //   = 9.9999200e-8; w = 1 - 1.41420791e-3 = 0.99858579.
  // element 1 (g = -1): a = 0.05; d = -3.16227766e-4 / 0.223607021 =
  // -1.41421215e-3;
  //   b = 9.9999800e-8; w = -2 + 1.41421215e-3 = -1.99858579.
  // element 2 (g = 2): a = 0.2; d = 2 * 3.16227766e-4 / 0.447214007
  // = 1.41421321e-3;
  //   b = 9.9999950e-8; w = 0.5 - 1.41421321e-3 = 0.49858579.
  // step 2, element 0 (g = 0.25): a = 0.011875 + 0.003125 = 0.015;
  //   d = 0.25 * sqrt(9.99992e-8 + 1e-7) / sqrt(0.0150001) = 0.25
  //   * 4.47212701e-4 / 0.122474895 = 9.12866061e-4; w = 0.99858579
  //   - 9.12866061e-4 = 0.99767293.
  // element 1 (g = 1): a = 0.0475 + 0.05 = 0.0975;
  //   d = sqrt(9.99998e-8 + 1e-7) / sqrt(0.0975001) = 4.47213372e-4 /
  //   0.312250216 = 1.43222830e-3; w = -1.99858579 - 1.43222830e-3 =
  //   -2.00001802.
  // element 2 (g = -1): a = 0.19 + 0.05 = 0.24;
  //   d = -sqrt(9.999995e-8 + 1e-7) / sqrt(0.2400001) = -4.47213539e-4 /
  //   0.489897951 = -9.12870625e-4; w = 0.49858579 + 9.12870625e-4 =
  //   0.49949866.
  ExpectTwoSteps("adadelta", 1.0f, {0.99858579, -1.99858579, 0.49858579},
                 {0.99767293, -2.00001802, 0.49949866});
}

TEST(OptimizerTest, AdadeltaLearningRateScalesTheStep) {
  // With lr 0.5 the first step is half the lr-1 step: d = 1.41420791e-3 for
  // element 0.
  std::unique_ptr<Optimizer> opt = Make("adadelta", 0.5f);
  ASSERT_NE(opt, nullptr);
  std::vector<float> w = kWeights;
  opt->Step(absl::MakeSpan(w), kGrad1);
  EXPECT_NEAR(w[0], 1.0 - 0.5 * 1.41420791e-3, 1e-7);
}

TEST(OptimizerTest, SetLearningRateKeepsTheState) {
  // Two steps at lr 1, then the second step again at lr 0.5 from the same
  // state: the second step's change halves, so the accumulators survived the
  // change (a fresh optimizer would take another first step).
  for (const char* name : {"sgd", "momentum", "adadelta", "adam"}) {
    std::unique_ptr<Optimizer> full = Make(name, 1.0f);
    std::unique_ptr<Optimizer> half = Make(name, 1.0f);
    ASSERT_NE(full, nullptr);
    ASSERT_NE(half, nullptr);
    std::vector<float> w_full = kWeights, w_half = kWeights;
    full->Step(absl::MakeSpan(w_full), kGrad1);
    half->Step(absl::MakeSpan(w_half), kGrad1);
    const std::vector<float> after1 = w_full;
    full->Step(absl::MakeSpan(w_full), kGrad2);
    half->SetLearningRate(0.5f);
    half->Step(absl::MakeSpan(w_half), kGrad2);
    for (int i = 0; i < 3; ++i) {
      if (std::string(name) == "momentum") {
        // v2 = 0.9 v1 - lr g2, and v1 was taken at lr 1: only the g2 term
        // halves. v1 = after1 - w0.
        const double v1 = after1[i] - kWeights[i];
        EXPECT_NEAR(w_half[i] - after1[i], 0.9 * v1 - 0.5 * kGrad2[i], 1e-6)
            << name << ", " << i;
      } else {
        EXPECT_NEAR(w_half[i] - after1[i], 0.5 * (w_full[i] - after1[i]), 1e-6)
            << name << ", " << i;
      }
    }
  }
}

TEST(OptimizerTest, Adam) {
  // beta1 0.9, beta2 0.999, eps 1e-7, lr 0.1.
  //   m = 0.9 m + 0.1 g; v = 0.999 v + 0.001 g^2;
  //   step = lr sqrt(1 - 0.999^t) / (1 - 0.9^t); w -= step m / (sqrt(v) + eps).
  // t = 1: step = 0.1 sqrt(0.001) / 0.1 = 0.0316227766.
  //   element 0: m = 0.05, v = 0.00025, sqrt(v) = 0.0158113883;
  //     w = 1 - 0.0316227766 * 0.05 / 0.0158114883 = 1 - 0.0999993675 =
  //     0.90000063.
  //   element 1: m = -0.1, v = 0.001, sqrt(v) = 0.0316227766;
  //     w = -2 + 0.0316227766 * 0.1 / 0.0316228766 = -2 + 0.0999996838 =
  //     -1.90000032.
  //   element 2: m = 0.2, v = 0.004, sqrt(v) = 0.0632455532;
  //     w = 0.5 - 0.0316227766 * 0.2 / 0.0632456532 = 0.5 - 0.0999998419 =
  //     0.40000016.
  // t = 2: step = 0.1 sqrt(1 - 0.998001) / (1 - 0.81) = 0.1 * 0.0447101778 /
  // 0.19
  //   = 0.0235316725.
  //   element 0: m = 0.045 + 0.025 = 0.07, v = 0.00024975 + 0.0000625 =
  //   0.00031225,
  //     sqrt(v) = 0.0176705970; w = 0.90000063 - 0.0235316725 * 0.07 /
  //     0.0176706970 = 0.90000063 - 0.0932174 = 0.80678320.
  //   element 1: m = -0.09 + 0.1 = 0.01, v = 0.000999 + 0.001 = 0.001999,
  //     sqrt(v) = 0.0447101778; w = -1.90000032 - 0.0235316725 * 0.01 /
  //     0.0447102778 = -1.90000032 - 0.00526314 = -1.90526346.
  //   element 2: m = 0.18 - 0.1 = 0.08, v = 0.003996 + 0.001 = 0.004996,
  //     sqrt(v) = 0.0706823882; w = 0.40000016 - 0.0235316725 * 0.08 /
  //     0.0706824882 = 0.40000016 - 0.02663367 = 0.37336649.
  ExpectTwoSteps("adam", 0.1f, {0.90000063, -1.90000032, 0.40000016},
                 {0.80678320, -1.90526346, 0.37336649});
}

TEST(OptimizerTest, StateIsPerElement) {
  // A zero gradient leaves an element alone in every optimizer, whatever the
  // others do.
  for (const char* name : {"sgd", "momentum", "adadelta", "adam"}) {
    std::unique_ptr<Optimizer> opt = Make(name, 0.1f);
    ASSERT_NE(opt, nullptr);
    std::vector<float> w = kWeights;
    const std::vector<float> g = {0.0f, 1.0f, 0.0f};
    opt->Step(absl::MakeSpan(w), g);
    opt->Step(absl::MakeSpan(w), g);
    EXPECT_EQ(w[0], kWeights[0]) << name;
    EXPECT_EQ(w[2], kWeights[2]) << name;
    EXPECT_LT(w[1], kWeights[1]) << name;
  }
}

TEST(OptimizerTest, UnknownNameIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt =
      MakeOptimizer("rmsprop", 0.1f, 3);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opt.status().message(), HasSubstr("rmsprop"));
  EXPECT_EQ(MakeOptimizer("", 0.1f, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeOptimizer("Adam", 0.1f, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, NonPositiveLearningRateIsInvalidArgument) {
  for (const char* name : {"sgd", "momentum", "adadelta", "adam"}) {
    for (float lr : {0.0f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
      absl::StatusOr<std::unique_ptr<Optimizer>> opt =
          MakeOptimizer(name, lr, 3);
      EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument)
          << name << " lr " << lr;
    }
  }
}

}  // namespace
}  // namespace fedlearn::nn
