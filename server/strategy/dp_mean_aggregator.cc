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

double DpMeanAggregator::CountStddev(int sampled) const {
  if (params_.clipped_count_stddev > 0) return params_.clipped_count_stddev;
  // Andrew et al.'s choice, n / 20, raised to z where that is smaller: below
  // z / 2 no split of the budget exists, and at z the count takes a quarter
  // of it (z_Delta = 1.15 z).
  return std::max(sampled / 20.0, params_.noise_multiplier);
}

double DpMeanAggregator::SumNoiseMultiplier(int sampled) const {
  const double z = params_.noise_multiplier;
  if (!params_.adaptive()) return z;
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
  if (absl::Status s = AddSecureGaussianNoise(SumNoiseMultiplier(sampled_) * c,
                                              absl::MakeSpan(sum_));
      !s.ok()) {
    return s;
  }
  double next = c;
  if (params_.adaptive()) {
    double within = within_clip_;
    if (absl::Status s = AddSecureGaussianNoise(CountStddev(sampled_),
                                                absl::MakeSpan(&within, 1));
        !s.ok()) {
      return s;
    }
    const double share = within / sampled_;
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
