#include "client/nn/conv2d.h"

#include <algorithm>
#include <cstring>

#include "client/nn/eigen_types.h"
#include "client/nn/winograd.h"

namespace fedlearn::nn {

Conv2D::Conv2D(int out_channels, int kernel, Padding padding)
    : out_channels_(out_channels), kernel_(kernel), padding_(padding) {}

Conv2D::~Conv2D() = default;

Shape Conv2D::Init(const Shape& input) {
  in_ = input;
  pad_ = padding_ == Padding::kSame ? (kernel_ - 1) / 2 : 0;
  out_ = Shape{out_channels_, input.h + 2 * pad_ - kernel_ + 1,
               input.w + 2 * pad_ - kernel_ + 1, /*spatial=*/true};
  winograd_.reset();
  if (kernel_ == 3 && in_.c >= kWinogradMinChannels) {
    winograd_ = std::make_unique<Winograd3x3>();
    winograd_->Init(in_, out_, pad_);
  }
  return out_;
}

void Conv2D::Reserve(int max_batch) {
  if (winograd_) {
    winograd_->Reserve(max_batch);
    return;
  }
  const size_t size = static_cast<size_t>(max_batch) * out_.h * out_.w * in_.c *
                      kernel_ * kernel_;
  if (patches_.size() < size) patches_.resize(size);
  dpatches_.resize(static_cast<size_t>(out_.h) * out_.w * in_.c * kernel_ *
                   kernel_);
}

void Conv2D::Bind(int i, float* values, float* grads) {
  if (i == 0) {
    weight_ = values;
    weight_grad_ = grads;
  } else {
    bias_ = values;
    bias_grad_ = grads;
  }
}

void Conv2D::Im2Col(const float* in, int batch) {
  const int64_t hw_out = out_.h * out_.w;
  const int64_t m = batch * hw_out;
  // Column (ci, ky, kx) holds in[ci][b][y + ky - pad][x + kx - pad] for every
  // output position (b, y, x): for each output row, one contiguous run of the
  // input row.
  for (int64_t ci = 0; ci < in_.c; ++ci) {
    for (int ky = 0; ky < kernel_; ++ky) {
      for (int kx = 0; kx < kernel_; ++kx) {
        float* col = patches_.data() + ((ci * kernel_ + ky) * kernel_ + kx) * m;
        const int x0 =
            std::max(0, pad_ - kx);  // first output x with its input in range
        const int x1 =
            std::min<int>(out_.w, in_.w + pad_ - kx);  // one past the last
        for (int b = 0; b < batch; ++b) {
          const float* plane = in + (ci * batch + b) * in_.h * in_.w;
          for (int y = 0; y < out_.h; ++y) {
            float* dst = col + (b * out_.h + y) * out_.w;
            const int iy = y + ky - pad_;
            if (iy < 0 || iy >= in_.h) {
              std::fill(dst, dst + out_.w, 0.0f);
              continue;
            }
            const float* row = plane + iy * in_.w;
            std::fill(dst, dst + x0, 0.0f);
            if (x1 > x0) {
              std::memcpy(dst + x0, row + x0 + kx - pad_,
                          sizeof(float) * (x1 - x0));
            }
            std::fill(dst + std::max(x0, x1), dst + out_.w, 0.0f);
          }
        }
      }
    }
  }
}

void Conv2D::Col2Im(const float* dpatch, int b, int batch, float* din) const {
  const int64_t hw_out = out_.h * out_.w;
  for (int64_t ci = 0; ci < in_.c; ++ci) {
    float* plane = din + (ci * batch + b) * in_.h * in_.w;
    std::fill(plane, plane + in_.h * in_.w, 0.0f);
    for (int ky = 0; ky < kernel_; ++ky) {
      for (int kx = 0; kx < kernel_; ++kx) {
        const float* col =
            dpatch + ((ci * kernel_ + ky) * kernel_ + kx) * hw_out;
        const int x0 = std::max(0, pad_ - kx);
        const int x1 = std::min<int>(out_.w, in_.w + pad_ - kx);
        const int shift = kx - pad_;
        for (int y = 0; y < out_.h; ++y) {
          const int iy = y + ky - pad_;
          if (iy < 0 || iy >= in_.h) continue;
          const float* src = col + y * out_.w;
          float* row = plane + iy * in_.w;
          for (int x = x0; x < x1; ++x) row[x + shift] += src[x];
        }
      }
    }
  }
}

void Conv2D::Forward(const float* in, float* out, int batch,
                     bool /*training*/) {
  const int64_t m = batch * out_.h * out_.w;
  const int64_t k = in_.c * kernel_ * kernel_;
  MatrixMap y(out, m, out_channels_);
  if (winograd_) {
    winograd_->Forward(in, weight_, out, batch);
  } else {
    Im2Col(in, batch);
    ConstMatrixMap patches(patches_.data(), m, k);
    ConstMatrixMap weight(weight_, k,
                          out_channels_);  // [out][in*k*k] row-major = K x out
    y.noalias() = patches * weight;
  }
  y.rowwise() += ConstVectorMap(bias_, out_channels_).transpose();
}

void Conv2D::Backward(const float* in, const float* /*out*/, const float* dout,
                      float* din, int batch) {
  const int64_t m = batch * out_.h * out_.w;
  const int64_t k = in_.c * kernel_ * kernel_;
  if (winograd_) {
    winograd_->Backward(in, dout, weight_grad_, din, batch);
  } else {
    ConstMatrixMap patches(patches_.data(), m, k);
    ConstMatrixMap dy(dout, m, out_channels_);
    MatrixMap weight_grad(weight_grad_, k, out_channels_);
    weight_grad.noalias() = patches.transpose() * dy;
  }
  // Not Eigen's colwise().sum(): its vectorised reduction starts at the first
  // aligned address, so its rounding would depend on where `dout` happens to
  // sit and training would not be bit-reproducible from a seed. Eight running
  // sums, by index, combined in a fixed order: the same result wherever the
  // buffer is, and a loop the compiler vectorises.
  constexpr int kLanes = 8;
  for (int o = 0; o < out_channels_; ++o) {
    const float* column = dout + o * m;
    float lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) lanes[l] += column[i + l];
    }
    float sum = 0;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (; i < m; ++i) sum += column[i];
    bias_grad_[o] = sum;
  }
  if (din == nullptr || winograd_ != nullptr) return;
  // dX one sample at a time: that sample's patch gradients (h_out*w_out x K)
  // are scattered while they are still in cache, instead of writing all
  // batch*h_out*w_out x K of them out to memory and reading them back.
  const int64_t hw_out = out_.h * out_.w;
  ConstMatrixMap weight(weight_, k, out_channels_);
  MatrixMap dpatch(dpatches_.data(), hw_out, k);
  for (int b = 0; b < batch; ++b) {
    Eigen::Map<const Matrix, 0, Eigen::OuterStride<>> dy_b(
        dout + b * hw_out, hw_out, out_channels_, Eigen::OuterStride<>(m));
    dpatch.noalias() = dy_b * weight.transpose();
    Col2Im(dpatch.data(), b, batch, din);
  }
}

}  // namespace fedlearn::nn
