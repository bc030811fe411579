#ifndef FEDLEARN_CLIENT_NN_FLATTEN_H_
#define FEDLEARN_CLIENT_NN_FLATTEN_H_

#include "client/nn/layer.h"

namespace fedlearn::nn {

// Spatial (CNHW) to flat (one column per sample, features in (c, y, x) order as
// PyTorch's flatten), so that dense weights keep PyTorch's layout. Flat in: the
// identity.
class Flatten final : public Layer {
 public:
  Shape Init(const Shape& input) override {
    in_ = input;
    return Shape{input.size(), 1, 1, /*spatial=*/false};
  }
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  std::string name() const override { return "flatten"; }

 private:
  Shape in_;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_FLATTEN_H_
