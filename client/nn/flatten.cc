#include "client/nn/flatten.h"

#include <algorithm>

namespace fedlearn::nn {

void Flatten::Forward(const float* in, float* out, int batch,
                      bool /*training*/) {
  const int64_t plane = in_.h * in_.w;
  if (!in_.spatial || batch == 1) {  // the layouts coincide
    std::copy(in, in + batch * in_.size(), out);
    return;
  }
  // in[c][b][plane] -> out[b][c][plane]
  for (int64_t c = 0; c < in_.c; ++c) {
    for (int b = 0; b < batch; ++b) {
      const float* src = in + (c * batch + b) * plane;
      std::copy(src, src + plane, out + (b * in_.c + c) * plane);
    }
  }
}

void Flatten::Backward(const float* /*in*/, const float* /*out*/,
                       const float* dout, float* din, int batch) {
  if (din == nullptr) return;
  const int64_t plane = in_.h * in_.w;
  if (!in_.spatial || batch == 1) {
    std::copy(dout, dout + batch * in_.size(), din);
    return;
  }
  for (int64_t c = 0; c < in_.c; ++c) {
    for (int b = 0; b < batch; ++b) {
      const float* src = dout + (b * in_.c + c) * plane;
      std::copy(src, src + plane, din + (c * batch + b) * plane);
    }
  }
}

}  // namespace fedlearn::nn
