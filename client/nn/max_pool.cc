#include "client/nn/max_pool.h"

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
  const int64_t w_in = in_.w, h_out = out_.h, w_out = out_.w;
  for (int64_t p = 0; p < planes; ++p) {
    const float* src = in + p * in_.h * w_in;
    for (int64_t y = 0; y < h_out; ++y) {
      const float* r0 = src + 2 * y * w_in;
      const float* r1 = r0 + w_in;
      float* dst = out + (p * h_out + y) * w_out;
      int32_t* arg = argmax_.data() + (p * h_out + y) * w_out;
      // The first maximum in window order (0 1 / 2 3): the better of each
      // row's pair, then the better row, the top one on ties. Selects, not
      // branches, so that the loop vectorises.
      for (int64_t x = 0; x < w_out; ++x) {
        const float a = r0[2 * x], b = r0[2 * x + 1];
        const float c = r1[2 * x], d = r1[2 * x + 1];
        const float top = b > a ? b : a, bottom = d > c ? d : c;
        const int32_t top_arg = b > a ? 1 : 0, bottom_arg = d > c ? 3 : 2;
        const bool lower = bottom > top;
        dst[x] = lower ? bottom : top;
        arg[x] = lower ? bottom_arg : top_arg;
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
    const int32_t* arg = argmax_.data() + p * out_.h * out_.w;
    for (int64_t y = 0; y < out_.h; ++y) {
      for (int64_t x = 0; x < out_.w; ++x) {
        const int32_t a = arg[y * out_.w + x];
        dst[(2 * y + (a >> 1)) * in_.w + 2 * x + (a & 1)] = src[y * out_.w + x];
      }
    }
  }
}

}  // namespace fedlearn::nn
