#include "client/nn/dense.h"

#include "client/nn/eigen_types.h"

namespace fedlearn::nn {

Shape Dense::Init(const Shape& input) {
  inputs_ = input.size();
  return Shape{outputs_, 1, 1, /*spatial=*/false};
}

void Dense::Bind(int i, float* values, float* grads) {
  if (i == 0) {
    weight_ = values;
    weight_grad_ = grads;
  } else {
    bias_ = values;
    bias_grad_ = grads;
  }
}

void Dense::Forward(const float* in, float* out, int batch, bool /*training*/) {
  ConstMatrixMap x(in, inputs_, batch);
  ConstMatrixMap weight_t(weight_, inputs_, outputs_);
  MatrixMap y(out, outputs_, batch);
  y.noalias() = weight_t.transpose() * x;
  y.colwise() += ConstVectorMap(bias_, outputs_);
}

void Dense::Backward(const float* in, const float* /*out*/, const float* dout,
                     float* din, int batch) {
  ConstMatrixMap x(in, inputs_, batch);
  ConstMatrixMap dy(dout, outputs_, batch);
  MatrixMap weight_grad_t(weight_grad_, inputs_, outputs_);
  weight_grad_t.noalias() = x * dy.transpose();
  // Not Eigen's rowwise().sum(): the assignment peels rows up to the
  // destination's first aligned packet and sums those in another order than
  // the packet rows, so the bias gradient, and a seeded run, changed with where
  // the gradient buffer sits. Column by column for every row: one order
  // wherever the buffers are, vectorised across the rows.
  VectorMap bias_grad(bias_grad_, outputs_);
  bias_grad.setZero();
  for (int b = 0; b < batch; ++b) bias_grad += dy.col(b);
  if (din == nullptr) return;
  ConstMatrixMap weight_t(weight_, inputs_, outputs_);
  MatrixMap(din, inputs_, batch).noalias() = weight_t * dy;
}

}  // namespace fedlearn::nn
