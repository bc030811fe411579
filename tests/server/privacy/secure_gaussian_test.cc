#include "server/privacy/secure_gaussian.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace fedlearn {
namespace {

// Sample moments of n draws of N(0, s^2) against their sampling error: the
// mean's standard error is s / sqrt(n), the variance's s^2 sqrt(2 / n), the
// share within one s of the mean's sqrt(p (1 - p) / n). Bounds of 6 standard
// errors fail a correct generator about once in 10^9 runs.
TEST(SecureGaussianTest, MomentsMatchTheNormalDistribution) {
  const size_t n = 1 << 20;
  const double s = 2.5;
  std::vector<double> x(n, 0.0);
  ASSERT_TRUE(AddSecureGaussianNoise(s, absl::MakeSpan(x)).ok());
  double sum = 0, within = 0;
  for (double v : x) {
    sum += v;
    within += std::abs(v) < s;
  }
  const double mean = sum / n;
  double squares = 0, fourth = 0;
  for (double v : x) {
    squares += (v - mean) * (v - mean);
    fourth += std::pow(v - mean, 4);
  }
  const double variance = squares / (n - 1);
  EXPECT_NEAR(mean, 0.0, 6 * s / std::sqrt(n));
  EXPECT_NEAR(variance, s * s, 6 * s * s * std::sqrt(2.0 / n));
  const double p = 0.682689492137086;  // P(|X| < s)
  EXPECT_NEAR(within / n, p, 6 * std::sqrt(p * (1 - p) / n));
  // Kurtosis 3: tails of a normal, not of a uniform (1.8) or Laplace (6).
  EXPECT_NEAR(fourth / n / (variance * variance), 3.0, 0.05);
}

TEST(SecureGaussianTest, AddsToTheValuesAndHandlesAnOddCount) {
  std::vector<double> x(100001, 10.0);
  ASSERT_TRUE(AddSecureGaussianNoise(1.0, absl::MakeSpan(x)).ok());
  double sum = 0;
  for (double v : x) sum += v;
  EXPECT_NEAR(sum / x.size(), 10.0, 6 / std::sqrt(100001.0));
  EXPECT_NE(x.back(), 10.0);  // the odd one out is noised too
}

TEST(SecureGaussianTest, NoTwoDrawsAlike) {
  // Never seeded by us: two draws share no value.
  std::vector<double> a(1000, 0.0), b(1000, 0.0);
  ASSERT_TRUE(AddSecureGaussianNoise(1.0, absl::MakeSpan(a)).ok());
  ASSERT_TRUE(AddSecureGaussianNoise(1.0, absl::MakeSpan(b)).ok());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << i;
}

TEST(SecureGaussianTest, ZeroDeviationChangesNothing) {
  std::vector<double> x = {1.5, -2.0, 3.0};
  ASSERT_TRUE(AddSecureGaussianNoise(0.0, absl::MakeSpan(x)).ok());
  EXPECT_EQ(x, (std::vector<double>{1.5, -2.0, 3.0}));
}

}  // namespace
}  // namespace fedlearn
