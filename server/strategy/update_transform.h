#ifndef FEDLEARN_SERVER_STRATEGY_UPDATE_TRANSFORM_H_
#define FEDLEARN_SERVER_STRATEGY_UPDATE_TRANSFORM_H_

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn {

// A step every accepted update goes through before it is aggregated: clipping
// now, privacy noise or encoding checks later. It runs on the push's private
// staging buffer, outside every lock, so a slow transform holds only its own
// push. Implementations are immutable after construction and thread-safe.
class UpdateTransform {
 public:
  virtual ~UpdateTransform() = default;
  virtual absl::string_view name() const = 0;
  // Rewrites `update` in place.
  virtual void Apply(absl::Span<float> update) const = 0;
};

// Scales an update whose L2 norm exceeds `max_norm` down to exactly that norm
// (its direction kept); smaller updates pass unchanged. The norm is summed in
// double.
class ClipToNorm final : public UpdateTransform {
 public:
  explicit ClipToNorm(double max_norm) : max_norm_(max_norm) {}
  absl::string_view name() const override { return "clip_norm"; }
  void Apply(absl::Span<float> update) const override;

 private:
  const double max_norm_;
};

// The L2 norm of `values`: the root of SumOfSquares (common/tensor_codec.h).
double L2Norm(absl::Span<const float> values);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_UPDATE_TRANSFORM_H_
