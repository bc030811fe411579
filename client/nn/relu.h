#ifndef FEDLEARN_CLIENT_NN_RELU_H_
#define FEDLEARN_CLIENT_NN_RELU_H_

#include "client/nn/layer.h"

namespace fedlearn::nn {

// max(x, 0), elementwise; any layout.
class ReLU final : public Layer {
 public:
  Shape Init(const Shape& input) override {
    shape_ = input;
    return input;
  }
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  std::string name() const override { return "relu"; }

 private:
  Shape shape_;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_RELU_H_
