#ifndef FEDLEARN_CLIENT_NN_DENSE_H_
#define FEDLEARN_CLIENT_NN_DENSE_H_

#include "client/nn/layer.h"

namespace fedlearn::nn {

// Fully connected layer: flat in (F x batch), flat out (O x batch). Weights
// [out, in] (PyTorch's Linear layout, i.e. an F x O column-major matrix W^T),
// bias [out].
class Dense final : public Layer {
 public:
  explicit Dense(int outputs) : outputs_(outputs) {}

  Shape Init(const Shape& input) override;
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  int num_parameter_tensors() const override { return 2; }
  int64_t parameter_size(int i) const override {
    return i == 0 ? outputs_ * inputs_ : outputs_;
  }
  void Bind(int i, float* values, float* grads) override;
  std::string name() const override { return "dense"; }

 private:
  const int outputs_;
  int64_t inputs_ = 0;
  float* weight_ = nullptr;
  float* weight_grad_ = nullptr;
  float* bias_ = nullptr;
  float* bias_grad_ = nullptr;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_DENSE_H_
