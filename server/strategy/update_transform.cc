#include "server/strategy/update_transform.h"

#include <cmath>

namespace fedlearn {

double L2Norm(absl::Span<const float> values) {
  // Eight running sums, element i in sum i % 8, added up in a fixed order at
  // the end: one running sum would make every add wait for the one before
  // (the compiler may not reorder floating-point adds), eight fill a vector
  // register, and the result is the same on every machine.
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  const float* x = values.data();
  const size_t n = values.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    }
  }
  for (size_t l = 0; i < n; ++i, ++l) {
    lanes[l] += static_cast<double>(x[i]) * x[i];
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return std::sqrt(sum);
}

void ClipToNorm::Apply(absl::Span<float> update) const {
  const double norm = L2Norm(update);
  if (!(norm > max_norm_)) return;
  const double factor = max_norm_ / norm;
  for (float& x : update) x = static_cast<float>(x * factor);
}

}  // namespace fedlearn
