#include "server/strategy/update_transform.h"

#include <cmath>

#include "common/tensor_codec.h"

namespace fedlearn {

double L2Norm(absl::Span<const float> values) {
  return std::sqrt(SumOfSquares(values));
}

void ClipToNorm::Apply(absl::Span<float> update) const {
  const double norm = L2Norm(update);
  if (!(norm > max_norm_)) return;
  const double factor = max_norm_ / norm;
  for (float& x : update) x = static_cast<float>(x * factor);
}

}  // namespace fedlearn
