#include "common/nn/max_pool.h"

#include <algorithm>

namespace fedlearn::nn {

Shape MaxPool2D::Init(const Shape& input) {
  in_ = input;
  out_ = Shape{input.c, input.h / 2, input.w / 2, /*spatial=*/true};
  return out_;
}

void MaxPool2D::Reserve(int max_batch) {
  argmax_.resize(static_cast<size_t>(max_batch) * out_.size());
}

void MaxPool2D::Forward(const float* in, float* out, int batch,
                        bool /*training*/) {
  // CNHW: every (c, b) is one plane; planes are contiguous in both tensors.
  const int64_t planes = in_.c * batch;
  for (int64_t p = 0; p < planes; ++p) {
    const float* src = in + p * in_.h * in_.w;
    float* dst = out + p * out_.h * out_.w;
    uint8_t* arg = argmax_.data() + p * out_.h * out_.w;
    for (int64_t y = 0; y < out_.h; ++y) {
      const float* r0 = src + 2 * y * in_.w;
      const float* r1 = r0 + in_.w;
      for (int64_t x = 0; x < out_.w; ++x) {
        const float v[4] = {r0[2 * x], r0[2 * x + 1], r1[2 * x], r1[2 * x + 1]};
        uint8_t best = 0;
        for (uint8_t i = 1; i < 4; ++i) {
          if (v[i] > v[best]) best = i;
        }
        dst[y * out_.w + x] = v[best];
        arg[y * out_.w + x] = best;
      }
    }
  }
}

void MaxPool2D::Backward(const float* /*in*/, const float* /*out*/,
                         const float* dout, float* din, int batch) {
  if (din == nullptr) return;
  std::fill(din, din + batch * in_.size(), 0.0f);
  const int64_t planes = in_.c * batch;
  for (int64_t p = 0; p < planes; ++p) {
    float* dst = din + p * in_.h * in_.w;
    const float* src = dout + p * out_.h * out_.w;
    const uint8_t* arg = argmax_.data() + p * out_.h * out_.w;
    for (int64_t y = 0; y < out_.h; ++y) {
      for (int64_t x = 0; x < out_.w; ++x) {
        const uint8_t a = arg[y * out_.w + x];
        dst[(2 * y + (a >> 1)) * in_.w + 2 * x + (a & 1)] = src[y * out_.w + x];
      }
    }
  }
}

}  // namespace fedlearn::nn
