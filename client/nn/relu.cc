#include "client/nn/relu.h"

#include <algorithm>

namespace fedlearn::nn {

void ReLU::Forward(const float* in, float* out, int batch, bool /*training*/) {
  const int64_t n = batch * shape_.size();
  for (int64_t i = 0; i < n; ++i) out[i] = std::max(in[i], 0.0f);
}

void ReLU::Backward(const float* /*in*/, const float* out, const float* dout,
                    float* din, int batch) {
  if (din == nullptr) return;
  const int64_t n = batch * shape_.size();
  for (int64_t i = 0; i < n; ++i) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

}  // namespace fedlearn::nn
