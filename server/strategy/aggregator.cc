#include "server/strategy/aggregator.h"

#include <algorithm>
#include <cassert>

namespace fedlearn {

WeightedMeanAggregator::WeightedMeanAggregator(size_t num_parameters)
    : sum_(num_parameters, 0.0) {}

void WeightedMeanAggregator::Reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  total_weight_ = 0;
  count_ = 0;
  finished_ = false;
}

void WeightedMeanAggregator::Fold(double weight, double scale,
                                  absl::Span<const float> update) {
  assert(!finished_);
  assert(update.size() == sum_.size());
  assert(weight > 0 && scale > 0);
  // weight * 1.0 is weight exactly: rounds mode folds n_i * update_i, as
  // FedAvg always did.
  const double w = weight * scale;
  double* __restrict sum = sum_.data();
  const float* __restrict x = update.data();
  const size_t n = sum_.size();
  // One fused multiply-add per element; the compiler vectorises this loop.
  for (size_t i = 0; i < n; ++i) sum[i] += w * static_cast<double>(x[i]);
  total_weight_ += weight;
  ++count_;
}

absl::StatusOr<absl::Span<const double>> WeightedMeanAggregator::Finish() {
  assert(count_ > 0 && total_weight_ > 0);
  if (!finished_) {
    for (double& s : sum_) s /= total_weight_;
    finished_ = true;
  }
  return absl::Span<const double>(sum_);
}

}  // namespace fedlearn
