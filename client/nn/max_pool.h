#ifndef FEDLEARN_CLIENT_NN_MAX_POOL_H_
#define FEDLEARN_CLIENT_NN_MAX_POOL_H_

#include <cstdint>
#include <vector>

#include "client/nn/layer.h"

namespace fedlearn::nn {

// 2x2 max pooling, stride 2 (odd edges dropped, as Keras' 'valid'). Spatial in
// and out. Forward remembers which of the four inputs won, for backward.
class MaxPool2D final : public Layer {
 public:
  Shape Init(const Shape& input) override;
  void Reserve(int max_batch) override;
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  std::string name() const override { return "max_pool2d"; }

 private:
  Shape in_, out_;
  // Per output element: 0..3, the winner in its window. 32 bits, not 8, so
  // that the forward loop vectorises 8 windows at a time, as rows of 12 need.
  std::vector<int32_t> argmax_;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_MAX_POOL_H_
