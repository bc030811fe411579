#ifndef FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_
#define FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_

#include <cstddef>
#include <vector>

#include "server/strategy/aggregator.h"

namespace fedlearn {

// Central DP-FedAvg's aggregate (McMahan et al. 2018, "Learning differentially
// private recurrent language models"; the fixed-denominator estimator):
//   Delta = (sum_i update_i + N(0, (z C)^2 I)) / n,
// over updates already clipped to L2 norm C (the strategy's ClipToNorm runs
// first, on each push's private buffer), n being the number of clients sampled
// for the step (BeginStep), not the number that answered. One client then
// moves the sum by at most C, which the noise of standard deviation z C
// covers, and Delta by at most C / n. num_examples is ignored: a mean weighted
// by what each client claims would let one client move Delta by more than
// C / n, past what the noise covers. The noise is drawn once per step, at
// Finish, from the secure generator (privacy/secure_gaussian.h).
// Memory: one double per parameter, as the weighted mean.
class DpMeanAggregator final : public Aggregator {
 public:
  DpMeanAggregator(size_t num_parameters, double clip_norm,
                   double noise_multiplier);

  size_t bytes_per_update() const override { return 0; }
  void BeginStep(int sampled) override;
  void Reset() override;
  // `weight` is ignored (see above); `scale` multiplies the update.
  void Fold(double weight, double scale,
            absl::Span<const float> update) override;
  int count() const override { return count_; }
  // INTERNAL if the secure generator fails; the step is then abandoned.
  absl::StatusOr<absl::Span<const double>> Finish() override;

  double noise_stddev() const { return noise_stddev_; }

 private:
  const double noise_stddev_;  // z * C, on the sum
  std::vector<double> sum_;
  int sampled_ = 0;  // the fixed denominator
  int count_ = 0;
  bool finished_ = false;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_
