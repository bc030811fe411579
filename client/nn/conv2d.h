#ifndef FEDLEARN_CLIENT_NN_CONV2D_H_
#define FEDLEARN_CLIENT_NN_CONV2D_H_

#include <memory>
#include <vector>

#include "client/nn/layer.h"

namespace fedlearn::nn {

class Winograd3x3;

// 2-D convolution, stride 1, square kernel, 'valid' or 'same' zero padding.
// Spatial in, spatial out. Weights [out, in, k, k] (PyTorch's layout), bias
// [out]. Forward lowers the input to a patch matrix (im2col), M x K
// column-major with M = batch*h_out*w_out positions and K = in*k*k, so the
// convolution is one GEMM Y(M x out) = patches * W^T whose result is already in
// the CNHW layout; backward reuses the patches for dW and, one sample at a
// time, computes that sample's dPatches and scatters them back (col2im) for dX.
// A 3x3 kernel over at least kWinogradMinChannels input channels runs as
// Winograd F(2x2, 3x3) instead (winograd.h): 16 small GEMMs with 2.25x fewer
// multiplications than the patch GEMM.
class Conv2D final : public Layer {
 public:
  enum class Padding { kValid, kSame };
  // Below this many input channels the Winograd GEMMs are too thin to beat
  // the patch GEMM (a first layer on one grey channel).
  static constexpr int kWinogradMinChannels = 4;
  Conv2D(int out_channels, int kernel, Padding padding);
  ~Conv2D() override;

  Shape Init(const Shape& input) override;
  void Reserve(int max_batch) override;
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  int num_parameter_tensors() const override { return 2; }
  int64_t parameter_size(int i) const override {
    return i == 0 ? out_channels_ * in_.c * kernel_ * kernel_ : out_channels_;
  }
  void Bind(int i, float* values, float* grads) override;
  std::string name() const override { return "conv2d"; }
  bool uses_winograd() const { return winograd_ != nullptr; }

 private:
  void Im2Col(const float* in, int batch);
  // Adds sample b's patch gradients (h_out*w_out x K, column-major) into its
  // planes of din (CNHW, `batch` samples), which it zeroes first.
  void Col2Im(const float* dpatch, int b, int batch, float* din) const;

  const int out_channels_;
  const int kernel_;
  const Padding padding_;
  Shape in_, out_;
  int pad_ = 0;
  std::unique_ptr<Winograd3x3> winograd_;  // null: im2col
  float* weight_ = nullptr;
  float* weight_grad_ = nullptr;
  float* bias_ = nullptr;
  float* bias_grad_ = nullptr;
  std::vector<float>
      patches_;  // M x K, column-major (each column one (ci, ky, kx))
  std::vector<float> dpatches_;  // one sample's rows of it, for backward
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_CONV2D_H_
