#include "server/strategy/server_optimizer.h"

#include <cmath>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using Rule = AdaptiveServerOptimizer::Rule;

std::vector<float> Step(ServerOptimizer& opt, const std::vector<double>& delta,
                        const std::vector<float>& x) {
  std::vector<float> next(x.size(), -99.0f);
  opt.Step(delta, x, absl::MakeSpan(next));
  return next;
}

TEST(SgdServerOptimizerTest, RateOneAddsTheDeltaRoundedOnce) {
  SgdServerOptimizer sgd(3, 1.0, 0.0);
  // 0.1 + 0.2 in double, rounded once to float.
  EXPECT_THAT(Step(sgd, {0.2, -0.5, 1e-9}, {0.1f, 2.0f, 1.0f}),
              ElementsAre(static_cast<float>(double{0.1f} + 0.2), 1.5f, 1.0f));
  EXPECT_TRUE(sgd.State().slots.empty());  // no state to save
  EXPECT_EQ(sgd.State().steps, 1);
}

TEST(SgdServerOptimizerTest, ServerLearningRateScalesTheStep) {
  SgdServerOptimizer sgd(2, 0.5, 0.0);
  EXPECT_THAT(Step(sgd, {2.0, -4.0}, {1.0f, 1.0f}), ElementsAre(2.0f, -1.0f));
}

TEST(SgdServerOptimizerTest, MomentumByHand) {
  // beta 0.5, eta 1: v1 = [1, 2], x1 = x0 + v1; v2 = 0.5 v1 + [1, -2] =
  // [1.5, -1], x2 = x1 + v2.
  SgdServerOptimizer m(2, 1.0, 0.5);
  const std::vector<float> x1 = Step(m, {1.0, 2.0}, {0.0f, 0.0f});
  EXPECT_THAT(x1, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(Step(m, {1.0, -2.0}, x1), ElementsAre(2.5f, 1.0f));
  const OptimizerState state = m.State();
  ASSERT_EQ(state.slots.size(), 1u);
  EXPECT_EQ(state.slots[0].first, "momentum");
  EXPECT_THAT(*state.slots[0].second, ElementsAre(1.5f, -1.0f));
}

// tau = 1 (v starts at 1), beta_1 = beta_2 = 0.5, eta = 1, Delta = [1, 3]:
//   m1 = 0.5 Delta = [0.5, 1.5]
//   Adagrad v1 = 1 + Delta^2 = [2, 10]
//   Adam    v1 = 0.5 + 0.5 Delta^2 = [1, 5]
//   Yogi    v1 = 1 - 0.5 Delta^2 sign(1 - Delta^2) = [1 - 0, 1 + 4.5] =
//   [1, 5.5] x1 = m1 / (sqrt(v1) + 1).
AdaptiveServerOptimizer::Params HandParams(Rule rule) {
  AdaptiveServerOptimizer::Params p;
  p.rule = rule;
  p.learning_rate = 1.0;
  p.beta_1 = 0.5;
  p.beta_2 = 0.5;
  p.tau = 1.0;
  return p;
}

TEST(AdaptiveServerOptimizerTest, FedAdagradByHand) {
  AdaptiveServerOptimizer opt(2, HandParams(Rule::kAdagrad));
  EXPECT_THAT(Step(opt, {1.0, 3.0}, {0.0f, 0.0f}),
              ElementsAre(FloatNear(0.5 / (std::sqrt(2.0) + 1), 1e-7),
                          FloatNear(1.5 / (std::sqrt(10.0) + 1), 1e-7)));
  EXPECT_THAT(*opt.State().slots[1].second, ElementsAre(2.0f, 10.0f));
}

TEST(AdaptiveServerOptimizerTest, FedAdamByHand) {
  AdaptiveServerOptimizer opt(2, HandParams(Rule::kAdam));
  EXPECT_THAT(Step(opt, {1.0, 3.0}, {0.0f, 0.0f}),
              ElementsAre(0.25f, FloatNear(1.5 / (std::sqrt(5.0) + 1), 1e-7)));
  const OptimizerState state = opt.State();
  EXPECT_EQ(state.slots[0].first, "m");
  EXPECT_THAT(*state.slots[0].second, ElementsAre(0.5f, 1.5f));
  EXPECT_THAT(*state.slots[1].second, ElementsAre(1.0f, 5.0f));
}

TEST(AdaptiveServerOptimizerTest, FedYogiByHand) {
  AdaptiveServerOptimizer opt(2, HandParams(Rule::kYogi));
  EXPECT_THAT(Step(opt, {1.0, 3.0}, {0.0f, 0.0f}),
              ElementsAre(0.25f, FloatNear(1.5 / (std::sqrt(5.5) + 1), 1e-7)));
  EXPECT_THAT(*opt.State().slots[1].second, ElementsAre(1.0f, 5.5f));
}

TEST(AdaptiveServerOptimizerTest, SecondStepByHand) {
  // FedAdam, from the state above, Delta = [-1, 1]:
  //   m2 = 0.5 [0.5, 1.5] + 0.5 [-1, 1] = [-0.25, 1.25]
  //   v2 = 0.5 [1, 5] + 0.5 [1, 1] = [1, 3]
  //   x2 = x1 + m2 / (sqrt(v2) + 1)
  AdaptiveServerOptimizer opt(2, HandParams(Rule::kAdam));
  const std::vector<float> x1 = Step(opt, {1.0, 3.0}, {0.0f, 0.0f});
  const std::vector<float> x2 = Step(opt, {-1.0, 1.0}, x1);
  EXPECT_THAT(
      x2, ElementsAre(FloatNear(0.25 - 0.125, 1e-7),
                      FloatNear(x1[1] + 1.25 / (std::sqrt(3.0) + 1), 1e-6)));
}

TEST(AdaptiveServerOptimizerTest, BiasCorrectionScalesTheFirstSteps) {
  // Step 1: eta sqrt(1 - 0.5) / (1 - 0.5) = sqrt(2) times the plain step.
  AdaptiveServerOptimizer::Params p = HandParams(Rule::kAdam);
  p.bias_correction = true;
  AdaptiveServerOptimizer opt(2, p);
  EXPECT_THAT(Step(opt, {1.0, 3.0}, {0.0f, 0.0f}),
              ElementsAre(FloatNear(0.25 * std::sqrt(2.0), 1e-7),
                          FloatNear(std::sqrt(2.0) * 1.5 / (std::sqrt(5.0) + 1),
                                    1e-6)));
}

TEST(AdaptiveServerOptimizerTest, VStartsAtTauSquared) {
  // The paper's v_{-1} = tau^2: a zero Delta leaves v there and moves nothing.
  AdaptiveServerOptimizer::Params p = HandParams(Rule::kAdam);
  p.tau = 0.5;
  AdaptiveServerOptimizer opt(1, p);
  EXPECT_THAT(*opt.State().slots[1].second, ElementsAre(0.25f));
  EXPECT_THAT(Step(opt, {0.0}, {3.0f}), ElementsAre(3.0f));
  EXPECT_THAT(*opt.State().slots[1].second, ElementsAre(0.125f));
}

// A run killed after step 2 and resumed from its saved state makes the same
// model at step 3, bit for bit.
TEST(ServerOptimizerStateTest, RestoredStateContinuesBitForBit) {
  AdaptiveServerOptimizer::Params p;  // the defaults
  p.rule = Rule::kYogi;
  AdaptiveServerOptimizer original(3, p);
  std::vector<float> x = {0.3f, -0.1f, 2.0f};
  x = Step(original, {0.01, -0.02, 0.3}, x);
  x = Step(original, {-0.05, 0.04, 0.1}, x);
  AdaptiveServerOptimizer resumed(3, p);
  ASSERT_TRUE(resumed.Restore(original.State()).ok());
  EXPECT_EQ(resumed.State().steps, 2);
  const std::vector<double> delta = {0.2, 0.0, -1e-3};
  EXPECT_EQ(Step(resumed, delta, x), Step(original, delta, x));
}

TEST(ServerOptimizerStateTest, ASnapshotIsNotChangedByLaterSteps) {
  SgdServerOptimizer m(2, 1.0, 0.9);
  Step(m, {1.0, 1.0}, {0.0f, 0.0f});
  const OptimizerState saved = m.State();  // a save in progress holds it
  Step(m, {1.0, 1.0}, {0.0f, 0.0f});
  EXPECT_THAT(*saved.slots[0].second, ElementsAre(1.0f, 1.0f));
  EXPECT_THAT(*m.State().slots[0].second, ElementsAre(1.9f, 1.9f));
}

TEST(ServerOptimizerStateTest, RestoreRefusesStateOfAnotherShape) {
  AdaptiveServerOptimizer adam(2, AdaptiveServerOptimizer::Params{});
  SgdServerOptimizer momentum(2, 1.0, 0.9);
  EXPECT_EQ(adam.Restore(momentum.State()).code(),
            absl::StatusCode::kInvalidArgument);
  AdaptiveServerOptimizer longer(3, AdaptiveServerOptimizer::Params{});
  EXPECT_EQ(adam.Restore(longer.State()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(momentum.Restore(OptimizerState{}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlearn
