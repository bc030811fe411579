#include "server/strategy/dp_mean_aggregator.h"

#include <algorithm>
#include <cassert>

#include "server/privacy/secure_gaussian.h"

namespace fedlearn {

DpMeanAggregator::DpMeanAggregator(size_t num_parameters, double clip_norm,
                                   double noise_multiplier)
    : noise_stddev_(clip_norm * noise_multiplier), sum_(num_parameters, 0.0) {}

void DpMeanAggregator::BeginStep(int sampled) {
  assert(sampled > 0);
  sampled_ = sampled;
}

void DpMeanAggregator::Reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  count_ = 0;
  finished_ = false;
}

void DpMeanAggregator::Fold(double weight, double scale,
                            absl::Span<const float> update) {
  (void)weight;
  assert(!finished_ && update.size() == sum_.size() && scale > 0);
  double* __restrict sum = sum_.data();
  const float* __restrict x = update.data();
  const size_t n = sum_.size();
  for (size_t i = 0; i < n; ++i) sum[i] += scale * static_cast<double>(x[i]);
  ++count_;
}

absl::StatusOr<absl::Span<const double>> DpMeanAggregator::Finish() {
  assert(count_ > 0 && sampled_ >= count_);
  if (!finished_) {
    if (absl::Status s =
            AddSecureGaussianNoise(noise_stddev_, absl::MakeSpan(sum_));
        !s.ok()) {
      return s;
    }
    const double n = sampled_;
    for (double& s : sum_) s /= n;
    finished_ = true;
  }
  return absl::Span<const double>(sum_);
}

}  // namespace fedlearn
