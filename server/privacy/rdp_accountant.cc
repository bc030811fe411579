#include "server/privacy/rdp_accountant.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace fedlearn {
namespace {

// log(exp(a) + exp(b)) without overflow; -inf is the empty sum.
double LogAdd(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

double LogBinomial(double n, double k) {
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

// RDP at integer order `alpha` (Section 3.3 of Mironov et al. 2019).
double IntegerOrderRdp(double q, double z, int alpha) {
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * z * z);  // the Gaussian mechanism
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  double log_a = -std::numeric_limits<double>::infinity();
  for (int k = 0; k <= alpha; ++k) {
    const double term = LogBinomial(alpha, k) + (alpha - k) * log_1mq +
                        k * log_q +
                        (static_cast<double>(k) * k - k) / (2 * z * z);
    log_a = LogAdd(log_a, term);
  }
  return log_a / (alpha - 1);
}

}  // namespace

absl::Span<const double> RdpOrders() {
  static const auto* orders = [] {
    auto* o = new std::vector<double>();
    for (int a = 2; a <= 32; ++a) o->push_back(a);
    for (int a : {40, 48, 56, 64, 80, 96, 128, 192, 256}) o->push_back(a);
    return o;
  }();
  return *orders;
}

std::vector<double> SampledGaussianRdp(double q, double z,
                                       absl::Span<const double> orders) {
  assert(q >= 0 && q <= 1 && z > 0);
  std::vector<double> rdp;
  rdp.reserve(orders.size());
  for (double alpha : orders) {
    assert(alpha >= 2 && alpha == std::floor(alpha));
    rdp.push_back(IntegerOrderRdp(q, z, static_cast<int>(alpha)));
  }
  return rdp;
}

double RdpToEpsilon(absl::Span<const double> rdp,
                    absl::Span<const double> orders, double delta,
                    double* best_order) {
  assert(rdp.size() == orders.size() && delta > 0 && delta < 1);
  double best = std::numeric_limits<double>::infinity();
  double best_alpha = orders.empty() ? 0 : orders[0];
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i];
    const double eps =
        rdp[i] + std::log1p(-1 / a) - (std::log(delta) + std::log(a)) / (a - 1);
    if (eps < best) {
      best = eps;
      best_alpha = a;
    }
  }
  if (best_order != nullptr) *best_order = best_alpha;
  return std::max(best, 0.0);
}

PrivacyAccountant::PrivacyAccountant(double delta, double max_epsilon)
    : delta_(delta), max_epsilon_(max_epsilon), rdp_(RdpOrders().size(), 0.0) {}

void PrivacyAccountant::Charge(double q, double z) {
  const std::vector<double> round = SampledGaussianRdp(q, z, RdpOrders());
  for (size_t i = 0; i < rdp_.size(); ++i) rdp_[i] += round[i];
  epsilon_ = RdpToEpsilon(rdp_, RdpOrders(), delta_);
  ++rounds_;
}

double PrivacyAccountant::EpsilonAfter(double q, double z) const {
  std::vector<double> after = SampledGaussianRdp(q, z, RdpOrders());
  for (size_t i = 0; i < rdp_.size(); ++i) after[i] += rdp_[i];
  return RdpToEpsilon(after, RdpOrders(), delta_);
}

std::optional<std::string> PrivacyAccountant::Refuse(double q, double z) const {
  if (max_epsilon_ <= 0) return std::nullopt;
  const double after = EpsilonAfter(q, z);
  if (after <= max_epsilon_) return std::nullopt;
  return absl::StrFormat(
      "privacy budget: epsilon %.4g after %d rounds; one more at q %.3g would "
      "reach %.4g > --dp_max_epsilon=%g (delta %g)",
      epsilon_, rounds_, q, after, max_epsilon_, delta_);
}

}  // namespace fedlearn
