#include "client/nn/dropout.h"

#include <algorithm>

namespace fedlearn::nn {

void Dropout::Reserve(int max_batch) {
  mask_.resize(static_cast<size_t>(max_batch) * shape_.size());
}

void Dropout::Forward(const float* in, float* out, int batch, bool training) {
  const int64_t n = batch * shape_.size();
  last_training_ = training && rate_ > 0;
  if (!last_training_) {
    std::copy(in, in + n, out);
    return;
  }
  const float scale = 1.0f / (1.0f - rate_);
  // Keep an element when a 24-bit uniform draw is at or above rate * 2^24.
  const uint32_t threshold = static_cast<uint32_t>(rate_ * 16777216.0f);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    mask_[i] = static_cast<uint32_t>(z >> 40) >= threshold ? scale : 0.0f;
    out[i] = in[i] * mask_[i];
  }
}

void Dropout::Backward(const float* /*in*/, const float* /*out*/,
                       const float* dout, float* din, int batch) {
  if (din == nullptr) return;
  const int64_t n = batch * shape_.size();
  if (!last_training_) {
    std::copy(dout, dout + n, din);
    return;
  }
  for (int64_t i = 0; i < n; ++i) din[i] = dout[i] * mask_[i];
}

}  // namespace fedlearn::nn
