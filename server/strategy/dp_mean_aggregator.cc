#include "server/strategy/dp_mean_aggregator.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "server/privacy/secure_gaussian.h"
#include "server/strategy/update_transform.h"

namespace fedlearn {

DpMeanAggregator::DpMeanAggregator(size_t num_parameters,
                                   const DpParams& params)
    : params_(params),
      clip_norm_(params.clip_norm),
      sum_(num_parameters, 0.0) {}

void DpMeanAggregator::BeginStep(int sampled) {
  assert(sampled > 0);
  sampled_ = sampled;
}

void DpMeanAggregator::Reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  count_ = 0;
  within_clip_ = 0;
  finished_ = false;
}

double DpParams::SumNoiseMultiplier(int sampled) const {
  const double z = noise_multiplier;
  if (!adaptive()) return z;
  const double sigma_b = CountStddev(sampled);
  return 1 / std::sqrt(1 / (z * z) - 1 / (4 * sigma_b * sigma_b));
}

absl::StatusOr<Aggregator::Staged> DpMeanAggregator::Stage(
    absl::Span<float> update) {
  const double c = clip_norm_.load();
  const double norm = L2Norm(update);
  Staged staged;
  staged.within_clip = norm <= c;
  if (!staged.within_clip) {
    const float scale = static_cast<float>(c / norm);
    for (float& v : update) v *= scale;
  }
  return staged;
}

void DpMeanAggregator::Fold(double weight, double scale,
                            absl::Span<const float> update) {
  FoldStaged(weight, scale, update, Staged());
}

void DpMeanAggregator::FoldStaged(double weight, double scale,
                                  absl::Span<const float> update,
                                  Staged staged) {
  (void)weight;
  assert(!finished_ && update.size() == sum_.size() && scale > 0);
  double* __restrict sum = sum_.data();
  const float* __restrict x = update.data();
  const size_t n = sum_.size();
  for (size_t i = 0; i < n; ++i) sum[i] += scale * static_cast<double>(x[i]);
  ++count_;
  if (staged.within_clip) ++within_clip_;
}

absl::StatusOr<absl::Span<const double>> DpMeanAggregator::Finish() {
  assert(count_ > 0 && sampled_ >= count_);
  if (finished_) return absl::Span<const double>(sum_);
  const double c = clip_norm_.load();
  if (absl::Status s = AddSecureGaussianNoise(
          params_.SumNoiseMultiplier(sampled_) * c, absl::MakeSpan(sum_));
      !s.ok()) {
    return s;
  }
  double next = c;
  if (params_.adaptive()) {
    // Each flag centred to +-1/2, so that one client moves the count by at
    // most 1/2 (DpParams::CountStddev); the share within C is then estimated
    // as (noised centred count) / n + 1/2, held to [0, 1].
    double centred = within_clip_ - 0.5 * count_;
    if (absl::Status s = AddSecureGaussianNoise(params_.CountStddev(sampled_),
                                                absl::MakeSpan(&centred, 1));
        !s.ok()) {
      return s;
    }
    const double share = std::clamp(centred / sampled_ + 0.5, 0.0, 1.0);
    next = c * std::exp(-params_.clip_learning_rate *
                        (share - params_.target_quantile));
  }
  const double n = sampled_;
  for (double& v : sum_) v /= n;
  finished_clip_norm_ = c;
  clip_norm_.store(next);
  finished_ = true;
  return absl::Span<const double>(sum_);
}

}  // namespace fedlearn
