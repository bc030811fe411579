#ifndef FEDLEARN_SERVER_PRIVACY_RDP_ACCOUNTANT_H_
#define FEDLEARN_SERVER_PRIVACY_RDP_ACCOUNTANT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace fedlearn {

// Renyi differential privacy of the sampled Gaussian mechanism (Mironov,
// Talwar and Zhang 2019, "Renyi Differential Privacy of the Sampled Gaussian
// Mechanism"), the mechanism of central DP-FedAvg: each client is in a round
// with probability q, its update is clipped to L2 norm C, and the sum gets
// N(0, (z C)^2) noise per coordinate. With sensitivity C the mechanism is
// that of a unit shift under N(0, z^2), and at an integer order alpha >= 2
//   A_alpha = sum_{k=0..alpha} C(alpha, k) (1-q)^(alpha-k) q^k
//             exp((k^2 - k) / (2 z^2)),
//   RDP(alpha) = log(A_alpha) / (alpha - 1),
// exactly (their Section 3.3, integer orders). At q = 1 this is the Gaussian
// mechanism's alpha / (2 z^2). Only integer orders are used (RdpOrders): RDP
// at any order is a valid bound, so leaving the fractional ones out can only
// over-state epsilon, and only when the best order would lie between 1 and 2
// (epsilon in the tens).

// The orders at which RDP is tracked: 2..32, then up to 256 in coarser steps.
absl::Span<const double> RdpOrders();

// RDP of one round at each order of `orders` (integers >= 2), for sampling
// rate q in [0, 1] and noise multiplier z > 0. Sums are taken in log space,
// so large orders and small z do not overflow.
std::vector<double> SampledGaussianRdp(double q, double z,
                                       absl::Span<const double> orders);

// (epsilon, delta)-DP from accumulated RDP (one value per order), with the
// conversion of Balle et al. 2020 ("Hypothesis testing interpretations and
// Renyi differential privacy", Theorem 21), tighter than Mironov's
// rdp + log(1/delta) / (alpha - 1):
//   epsilon = min over alpha of
//             rdp(alpha) + log((alpha - 1) / alpha)
//                        - (log(delta) + log(alpha)) / (alpha - 1),
// never below 0. `best_order`, if given, receives the minimising order.
double RdpToEpsilon(absl::Span<const double> rdp,
                    absl::Span<const double> orders, double delta,
                    double* best_order = nullptr);

// The privacy spent by a run: the RDP of its released rounds, summed per order
// (composition), and the epsilon that gives at `delta`. A round charges only
// if its aggregate is released (a new model version): an abandoned round
// publishes nothing. Memory: one double per order. Not thread-safe: the run
// controller serialises.
class PrivacyAccountant {
 public:
  // `max_epsilon` <= 0: no budget.
  PrivacyAccountant(double delta, double max_epsilon);

  // Adds a released round at sampling rate q with noise multiplier z.
  void Charge(double q, double z);
  // Epsilon spent so far (0 before the first round).
  double epsilon() const { return epsilon_; }
  int rounds() const { return rounds_; }
  double delta() const { return delta_; }
  double max_epsilon() const { return max_epsilon_; }

  // Epsilon after one more round at (q, z), the run unchanged.
  double EpsilonAfter(double q, double z) const;

  // Why a round at (q, z) must not be released: the budget it would exceed, as
  // the stop reason and log text; nullopt within the budget (or without one).
  std::optional<std::string> Refuse(double q, double z) const;

 private:
  const double delta_;
  const double max_epsilon_;
  std::vector<double> rdp_;  // per order of RdpOrders()
  double epsilon_ = 0;
  int rounds_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_RDP_ACCOUNTANT_H_
