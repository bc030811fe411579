#include "server/strategy/update_transform.h"

#include <cmath>

namespace fedlearn {

double L2Norm(absl::Span<const float> values) {
  double sum = 0;
  for (float x : values) sum += static_cast<double>(x) * x;
  return std::sqrt(sum);
}

void ClipToNorm::Apply(absl::Span<float> update) const {
  const double norm = L2Norm(update);
  if (!(norm > max_norm_)) return;
  const double factor = max_norm_ / norm;
  for (float& x : update) x = static_cast<float>(x * factor);
}

}  // namespace fedlearn
