#ifndef FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_
#define FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_

#include <atomic>
#include <cstddef>
#include <vector>

#include "common/aligned_vector.h"
#include "server/privacy/dp_params.h"
#include "server/strategy/aggregator.h"

namespace fedlearn {

// Central DP-FedAvg's aggregate (McMahan et al. 2018, "Learning differentially
// private recurrent language models"; the fixed-denominator estimator):
//   Delta = (sum_i clip_C(update_i) + N(0, (z C)^2 I)) / n,
// n being the number of clients sampled for the step (BeginStep), not the
// number that answered. One client then moves the sum by at most C, which the
// noise of standard deviation z C covers, and Delta by at most C / n.
// num_examples is ignored: a mean weighted by what each client claims would
// let one client move Delta by more than C / n, past what the noise covers.
// Stage clips each update on its push's private buffer, outside the lock.
// The noise is drawn once per step, at Finish, from the secure generator
// (privacy/secure_gaussian.h).
//
// Adaptive clipping (DpParams::adaptive, Andrew et al. 2021, "Differentially
// private learning with adaptive clipping"): Stage also notes whether the
// update was within C; Finish noises the count of those (each flag centred to
// +-1/2) with N(0, sigma_b^2) and moves C for the next step to
// C exp(-eta_C (b - gamma)), b the noised share within C. The update sum's
// noise multiplier is then DpParams::SumNoiseMultiplier, so that the two
// releases together are one Gaussian mechanism of multiplier z: the
// accountant charges z, as without adaptation.
//
// C changes only in Finish, under the controller's lock at a step's close;
// Stage reads it outside the lock. A push staged across a close is rejected by
// the scheduler (its step is gone), so every folded update was clipped to its
// own step's C. Memory: one double per parameter, as the weighted mean.
class DpMeanAggregator final : public Aggregator {
 public:
  DpMeanAggregator(size_t num_parameters, const DpParams& params);

  size_t bytes_per_update() const override { return 0; }
  void BeginStep(int sampled) override;
  void Reset() override;
  // Clips `update` in place to the step's C.
  absl::StatusOr<Staged> Stage(absl::Span<float> update) override;
  // Folds `update` as given (already clipped; within C). `weight` is ignored
  // (see above); `scale` multiplies the update.
  void Fold(double weight, double scale,
            absl::Span<const float> update) override;
  void FoldStaged(double weight, double scale, absl::Span<const float> update,
                  Staged staged) override;
  int count() const override { return count_; }
  // INTERNAL if the secure generator fails; the step is then abandoned and C
  // stays.
  absl::StatusOr<absl::Span<const double>> Finish() override;

  // The C updates of the open step are clipped to (after Finish: the next
  // step's).
  double clip_norm() const { return clip_norm_.load(); }
  // The C the last finished step clipped to.
  double finished_clip_norm() const { return finished_clip_norm_; }
  // A resumed run's C.
  void RestoreClipNorm(double clip_norm) { clip_norm_.store(clip_norm); }

 private:
  const DpParams params_;
  std::atomic<double> clip_norm_;
  double finished_clip_norm_ = 0;
  AlignedVector<double> sum_;  // on a cache line: the fold streams it
  int sampled_ = 0;            // the fixed denominator
  int count_ = 0;
  int within_clip_ = 0;  // folded updates whose norm was within C
  bool finished_ = false;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_DP_MEAN_AGGREGATOR_H_
