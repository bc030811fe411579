#include "server/privacy/rdp_accountant.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

TEST(SampledGaussianRdpTest, AtQOneIsTheGaussianMechanism) {
  const std::vector<double> orders = {2, 3, 10, 256};
  for (double z : {0.5, 1.0, 3.0}) {
    const std::vector<double> rdp = SampledGaussianRdp(1.0, z, orders);
    for (size_t i = 0; i < orders.size(); ++i) {
      EXPECT_DOUBLE_EQ(rdp[i], orders[i] / (2 * z * z)) << z;
    }
  }
}

TEST(SampledGaussianRdpTest, NoSamplingCostsNothing) {
  for (double rdp : SampledGaussianRdp(0.0, 1.0, RdpOrders())) {
    EXPECT_EQ(rdp, 0.0);
  }
}

TEST(SampledGaussianRdpTest, SmallOrdersByHand) {
  const double q = 0.1, z = 1.0;
  const double e = std::exp(1.0 / (z * z));
  // A_2 = (1-q)^2 + 2q(1-q) + q^2 e^(1/z^2) = 1 + q^2 (e^(1/z^2) - 1).
  const double a2 = 1 + q * q * (e - 1);
  // A_3 = (1-q)^3 + 3q(1-q)^2 + 3q^2(1-q) e^(1/z^2) + q^3 e^(3/z^2).
  const double a3 = std::pow(1 - q, 3) + 3 * q * std::pow(1 - q, 2) +
                    3 * q * q * (1 - q) * e + std::pow(q, 3) * std::exp(3.0);
  const std::vector<double> rdp = SampledGaussianRdp(q, z, {2, 3});
  EXPECT_NEAR(rdp[0], std::log(a2), 1e-14);
  EXPECT_NEAR(rdp[1], std::log(a3) / 2, 1e-14);
}

TEST(SampledGaussianRdpTest, LargeOrdersAndLittleNoiseStayFinite) {
  // exp(k^2 / (2 z^2)) overflows a double for k = 256, z = 0.3; the log-space
  // sum does not.
  const std::vector<double> rdp = SampledGaussianRdp(0.1, 0.3, {256});
  EXPECT_TRUE(std::isfinite(rdp[0]));
  // Dominated by the k = alpha term: (alpha log q + (alpha^2 - alpha) / (2
  // z^2)) / (alpha - 1).
  const double top = (256 * std::log(0.1) + (256.0 * 256 - 256) / 0.18) / 255;
  EXPECT_NEAR(rdp[0], top, 1e-9 * top);
}

TEST(RdpToEpsilonTest, ConversionByHand) {
  // One order, alpha = 2, RDP 1, delta 1e-5:
  //   1 + log(1/2) - (log(1e-5) + log(2)) / 1.
  const double expected = 1 + std::log(0.5) - (std::log(1e-5) + std::log(2.0));
  double best = 0;
  EXPECT_NEAR(RdpToEpsilon({1.0}, {2.0}, 1e-5, &best), expected, 1e-12);
  EXPECT_EQ(best, 2.0);
  // The minimum over orders, and never below 0.
  EXPECT_NEAR(RdpToEpsilon({1.0, 50.0}, {2.0, 3.0}, 1e-5), expected, 1e-12);
  EXPECT_EQ(RdpToEpsilon({0.0}, {256.0}, 0.5), 0.0);
}

TEST(PrivacyAccountantTest, RoundsComposeByAddingRdp) {
  PrivacyAccountant accountant(1e-5, 0);
  EXPECT_EQ(accountant.epsilon(), 0.0);
  for (int r = 0; r < 30; ++r) accountant.Charge(0.1, 1.2);
  std::vector<double> rdp = SampledGaussianRdp(0.1, 1.2, RdpOrders());
  for (double& x : rdp) x *= 30;
  EXPECT_DOUBLE_EQ(accountant.epsilon(), RdpToEpsilon(rdp, RdpOrders(), 1e-5));
  EXPECT_EQ(accountant.rounds(), 30);
}

TEST(PrivacyAccountantTest, EpsilonGrowsWithRoundsAndSamplingFallsWithNoise) {
  PrivacyAccountant a(1e-5, 0);
  double previous = 0;
  for (int r = 0; r < 10; ++r) {
    a.Charge(0.1, 1.0);
    EXPECT_GT(a.epsilon(), previous);
    previous = a.epsilon();
  }
  EXPECT_LT(a.EpsilonAfter(0.05, 1.0), a.EpsilonAfter(0.2, 1.0));
  EXPECT_LT(a.EpsilonAfter(0.1, 2.0), a.EpsilonAfter(0.1, 1.0));
}

TEST(PrivacyAccountantTest, RefusesTheRoundThatWouldExceedTheBudget) {
  PrivacyAccountant probe(1e-5, 0);
  for (int r = 0; r < 3; ++r) probe.Charge(0.1, 1.0);
  // A budget exactly at three rounds' epsilon: three pass, the fourth not.
  PrivacyAccountant budget(1e-5, probe.epsilon());
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(budget.Refuse(0.1, 1.0).has_value()) << r;
    budget.Charge(0.1, 1.0);
  }
  const std::optional<std::string> refused = budget.Refuse(0.1, 1.0);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("--dp_max_epsilon"));
  EXPECT_THAT(*refused, HasSubstr("after 3 rounds"));
  // A round that samples fewer clients may still fit.
  PrivacyAccountant none(1e-5, 0);
  for (int r = 0; r < 100; ++r) none.Charge(0.5, 0.5);
  EXPECT_FALSE(none.Refuse(0.5, 0.5).has_value());  // no budget: never
}

}  // namespace
}  // namespace fedlearn
