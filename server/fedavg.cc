#include "server/fedavg.h"

#include <algorithm>
#include <cassert>

namespace fedlearn {

FedAvgAccumulator::FedAvgAccumulator(size_t num_parameters)
    : sum_(num_parameters, 0.0) {}

void FedAvgAccumulator::Reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0);
  total_weight_ = 0;
  count_ = 0;
}

void FedAvgAccumulator::Fold(double weight, absl::Span<const float> update) {
  assert(update.size() == sum_.size());
  assert(weight > 0);
  double* __restrict sum = sum_.data();
  const float* __restrict x = update.data();
  const size_t n = sum_.size();
  // One fused multiply-add per element; the compiler vectorises this loop.
  for (size_t i = 0; i < n; ++i) sum[i] += weight * static_cast<double>(x[i]);
  total_weight_ += weight;
  ++count_;
}

void FedAvgAccumulator::ApplyMean(absl::Span<const float> global,
                                  absl::Span<float> out) const {
  assert(count_ > 0 && total_weight_ > 0);
  assert(global.size() == sum_.size() && out.size() == sum_.size());
  const double* sum = sum_.data();
  for (size_t i = 0; i < sum_.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(global[i]) +
                                sum[i] / total_weight_);
  }
}

}  // namespace fedlearn
