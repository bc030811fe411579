// Finite-difference gradient checks for every layer of client/nn, plus forward
// values against hand-computed examples and naive reference implementations.
//
// The checks use a random linear functional L = sum(r .* out) with a fixed
// random r, so dL/d(out) = r is what Backward receives. dL/dx and dL/d(params)
// from Backward are compared with central differences of L computed in double;
// the step is divided by the difference of the perturbed floats actually used,
// so the rounding of x +- h does not count as error.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "client/nn/conv2d.h"
#include "client/nn/dense.h"
#include "client/nn/dropout.h"
#include "client/nn/flatten.h"
#include "client/nn/layer.h"
#include "client/nn/max_pool.h"
#include "client/nn/relu.h"
#include "client/nn/threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn::nn {
namespace {

using ::testing::ElementsAreArray;
using ::testing::FloatEq;
using ::testing::Pointwise;

// The worst relative error accepted between an analytic and a numerical
// gradient.
constexpr double kTolerance = 1e-2;

std::vector<float> Uniform(size_t n, float lo, float hi, std::mt19937* rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// Uniform in [lo, hi] with a random sign: values at least `lo` away from 0 (for
// ReLU).
std::vector<float> AwayFromZero(size_t n, float lo, float hi,
                                std::mt19937* rng) {
  std::vector<float> v = Uniform(n, lo, hi, rng);
  std::bernoulli_distribution sign(0.5);
  for (float& x : v) {
    if (sign(*rng)) x = -x;
  }
  return v;
}

// Parameter storage for one layer under test: a value and a gradient vector per
// tensor, bound to the layer.
struct Parameters {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;
};

// Allocates the layer's parameter tensors (after Init), fills them from
// U(-scale, scale) and binds them.
Parameters BindRandomParameters(Layer* layer, float scale, std::mt19937* rng) {
  Parameters p;
  for (int i = 0; i < layer->num_parameter_tensors(); ++i) {
    p.values.push_back(Uniform(layer->parameter_size(i), -scale, scale, rng));
    p.grads.emplace_back(layer->parameter_size(i), 0.0f);
  }
  for (int i = 0; i < layer->num_parameter_tensors(); ++i) {
    layer->Bind(i, p.values[i].data(), p.grads[i].data());
  }
  return p;
}

// max_j |a_j - n_j| / max(|a_j|, |n_j|, floor), where floor = 1% of the largest
// |n_j| keeps entries that are zero or tiny from being judged by rounding noise
// alone.
double RelativeError(const std::vector<double>& analytic,
                     const std::vector<double>& numerical) {
  EXPECT_EQ(analytic.size(), numerical.size());
  double largest = 0;
  for (double n : numerical) largest = std::max(largest, std::abs(n));
  const double floor = std::max(1e-2 * largest, 1e-12);
  double worst = 0;
  for (size_t j = 0; j < analytic.size(); ++j) {
    const double scale =
        std::max({std::abs(analytic[j]), std::abs(numerical[j]), floor});
    worst = std::max(worst, std::abs(analytic[j] - numerical[j]) / scale);
  }
  return worst;
}

struct GradientErrors {
  double input = 0;                // dL/d(in)
  std::vector<double> parameters;  // dL/d(parameter tensor i)
};

// Runs the gradient check described at the top of the file on `layer` (already
// Init'ed for `in_shape`, parameters bound in `params`) with input `x` of
// `batch` samples. `before_forward` runs before every Forward (dropout reseeds
// its mask there).
GradientErrors CheckGradients(
    Layer* layer, const Shape& out_shape, int batch, std::vector<float> x,
    Parameters* params, bool training, float step,
    const std::function<void()>& before_forward = [] {}) {
  layer->Reserve(batch);
  std::mt19937 rng(99);
  const std::vector<float> r =
      Uniform(batch * out_shape.size(), -1.0f, 1.0f, &rng);
  std::vector<float> out(r.size());

  const auto loss = [&] {
    before_forward();
    layer->Forward(x.data(), out.data(), batch, training);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += double{r[i]} * out[i];
    return l;
  };
  // Central difference of L in the float at `v`, restored afterwards.
  const auto derivative = [&](float* v) {
    const float saved = *v;
    *v = saved + step;
    const float up = *v;
    const double l_up = loss();
    *v = saved - step;
    const float down = *v;
    const double l_down = loss();
    *v = saved;
    return (l_up - l_down) / (double{up} - double{down});
  };

  // Analytic gradients.
  loss();
  for (auto& g : params->grads) std::fill(g.begin(), g.end(), 0.0f);
  std::vector<float> din(x.size(),
                         1e9f);  // garbage: Backward must overwrite all of it
  layer->Backward(x.data(), out.data(), r.data(), din.data(), batch);
  const std::vector<double> analytic_input(din.begin(), din.end());
  std::vector<std::vector<double>> analytic_params;
  for (const auto& g : params->grads)
    analytic_params.emplace_back(g.begin(), g.end());

  GradientErrors errors;
  std::vector<double> numerical(x.size());
  for (size_t j = 0; j < x.size(); ++j) numerical[j] = derivative(&x[j]);
  errors.input = RelativeError(analytic_input, numerical);
  for (size_t t = 0; t < params->values.size(); ++t) {
    std::vector<float>& values = params->values[t];
    numerical.assign(values.size(), 0.0);
    for (size_t j = 0; j < values.size(); ++j)
      numerical[j] = derivative(&values[j]);
    errors.parameters.push_back(RelativeError(analytic_params[t], numerical));
  }
  return errors;
}

void ExpectGradientsMatch(const GradientErrors& errors) {
  EXPECT_LT(errors.input, kTolerance) << "dL/d(input)";
  for (size_t t = 0; t < errors.parameters.size(); ++t) {
    EXPECT_LT(errors.parameters[t], kTolerance)
        << "dL/d(parameter tensor " << t << ")";
  }
}

// Element (c, b, y, x) of a CNHW batch of `batch` samples of shape `s`.
size_t Cnhw(const Shape& s, int batch, int64_t c, int64_t b, int64_t y,
            int64_t x) {
  return static_cast<size_t>(((c * batch + b) * s.h + y) * s.w + x);
}

// Direct convolution in double: out[o][b][y][x] = bias[o] +
// sum_{i,ky,kx} w[o][i][ky][kx] * in[i][b][y+ky-pad][x+kx-pad] (zero outside).
std::vector<double> ReferenceConv(const std::vector<float>& in, const Shape& s,
                                  int batch, const std::vector<float>& w,
                                  const std::vector<float>& bias, int out_c,
                                  int k, int pad) {
  const Shape o{out_c, s.h + 2 * pad - k + 1, s.w + 2 * pad - k + 1, true};
  std::vector<double> out(batch * o.size());
  for (int oc = 0; oc < out_c; ++oc) {
    for (int b = 0; b < batch; ++b) {
      for (int64_t y = 0; y < o.h; ++y) {
        for (int64_t x = 0; x < o.w; ++x) {
          double sum = bias[oc];
          for (int64_t ic = 0; ic < s.c; ++ic) {
            for (int ky = 0; ky < k; ++ky) {
              for (int kx = 0; kx < k; ++kx) {
                const int64_t iy = y + ky - pad, ix = x + kx - pad;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                sum += double{w[((oc * s.c + ic) * k + ky) * k + kx]} *
                       in[Cnhw(s, batch, ic, b, iy, ix)];
              }
            }
          }
          out[Cnhw(o, batch, oc, b, y, x)] = sum;
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The checker itself: it must flag a gradient that is 5% off.

// out = a * x with one scalar parameter a; its gradient is deliberately 5% too
// large.
class ScaleWithWrongParameterGradient final : public Layer {
 public:
  Shape Init(const Shape& input) override { return shape_ = input; }
  void Forward(const float* in, float* out, int batch, bool) override {
    for (int64_t i = 0; i < batch * shape_.size(); ++i) out[i] = *a_ * in[i];
  }
  void Backward(const float* in, const float*, const float* dout, float* din,
                int batch) override {
    float sum = 0;
    for (int64_t i = 0; i < batch * shape_.size(); ++i) {
      sum += dout[i] * in[i];
      din[i] = *a_ * dout[i];
    }
    *a_grad_ = 1.05f * sum;
  }
  int num_parameter_tensors() const override { return 1; }
  int64_t parameter_size(int) const override { return 1; }
  void Bind(int, float* values, float* grads) override {
    a_ = values;
    a_grad_ = grads;
  }
  std::string name() const override { return "bad_scale"; }

 private:
  Shape shape_;
  float* a_ = nullptr;
  float* a_grad_ = nullptr;
};

TEST(GradientCheckTest, FlagsAWrongGradient) {
  std::mt19937 rng(1);
  ScaleWithWrongParameterGradient layer;
  const Shape in{4, 1, 1, false};
  const Shape out = layer.Init(in);
  Parameters p = BindRandomParameters(&layer, 1.0f, &rng);
  p.values[0][0] = 1.5f;
  const GradientErrors errors =
      CheckGradients(&layer, out, 3, Uniform(12, -1, 1, &rng), &p,
                     /*training=*/true, 0.05f);
  EXPECT_LT(errors.input, kTolerance);
  ASSERT_EQ(errors.parameters.size(), 1u);
  EXPECT_GT(errors.parameters[0], 4 * kTolerance);
}

// ---------------------------------------------------------------------------------------
// Conv2D

TEST(Conv2DTest, OutputShapes) {
  using P = Conv2D::Padding;
  const Shape in{3, 6, 7, true};
  Conv2D valid3(4, 3, P::kValid), same3(4, 3, P::kSame),
      valid5(2, 5, P::kValid), same5(2, 5, P::kSame);
  const Shape v3 = valid3.Init(in), s3 = same3.Init(in), v5 = valid5.Init(in),
              s5 = same5.Init(in);
  EXPECT_EQ(v3.c, 4);
  EXPECT_EQ(v3.h, 4);
  EXPECT_EQ(v3.w, 5);
  EXPECT_TRUE(v3.spatial);
  // 'same' keeps the spatial size.
  EXPECT_EQ(s3.h, 6);
  EXPECT_EQ(s3.w, 7);
  EXPECT_EQ(v5.h, 2);
  EXPECT_EQ(v5.w, 3);
  EXPECT_EQ(s5.c, 2);
  EXPECT_EQ(s5.h, 6);
  EXPECT_EQ(s5.w, 7);
  EXPECT_TRUE(s5.spatial);
  EXPECT_EQ(valid3.parameter_size(0), 4 * 3 * 3 * 3);
  EXPECT_EQ(valid3.parameter_size(1), 4);
  EXPECT_EQ(same5.parameter_size(0), 2 * 3 * 5 * 5);
  EXPECT_EQ(same5.num_parameter_tensors(), 2);
}

// One channel, 4x4 input, one 3x3 kernel, worked by hand.
//   input            kernel       bias 0.5
//   1 2 0 1          1  0 -1
//   0 1 3 2          0  2  0
//   2 0 1 1         -1  0  1
//   1 3 0 2
const std::vector<float> kHandInput = {1, 2, 0, 1, 0, 1, 3, 2,
                                       2, 0, 1, 1, 1, 3, 0, 2};
const std::vector<float> kHandKernel = {1, 0, -1, 0, 2, 0, -1, 0, 1};

TEST(Conv2DTest, ValidForwardByHand) {
  Conv2D conv(1, 3, Conv2D::Padding::kValid);
  const Shape out = conv.Init(Shape{1, 4, 4, true});
  ASSERT_EQ(out.h, 2);
  ASSERT_EQ(out.w, 2);
  conv.Reserve(1);
  std::vector<float> w = kHandKernel, b = {0.5f}, gw(9), gb(1);
  conv.Bind(0, w.data(), gw.data());
  conv.Bind(1, b.data(), gb.data());
  std::vector<float> y(4);
  conv.Forward(kHandInput.data(), y.data(), 1, /*training=*/false);
  // (0,0): window [1 2 0; 0 1 3; 2 0 1]: 1*1 - 0 + 2*1 - 1*2 + 1*1 = 2   -> 2.5
  // (0,1): window [2 0 1; 1 3 2; 0 1 1]: 2 - 1 + 2*3 - 0 + 1 = 8        -> 8.5
  // (1,0): window [0 1 3; 2 0 1; 1 3 0]: 0 - 3 + 2*0 - 1 + 0 = -4       -> -3.5
  // (1,1): window [1 3 2; 0 1 1; 3 0 2]: 1 - 2 + 2*1 - 3 + 2 = 0        -> 0.5
  EXPECT_THAT(y, ElementsAreArray({2.5f, 8.5f, -3.5f, 0.5f}));
}

TEST(Conv2DTest, SameForwardByHand) {
  Conv2D conv(1, 3, Conv2D::Padding::kSame);
  const Shape out = conv.Init(Shape{1, 4, 4, true});
  ASSERT_EQ(out.h, 4);
  ASSERT_EQ(out.w, 4);
  conv.Reserve(1);
  std::vector<float> w = kHandKernel, b = {0.5f}, gw(9), gb(1);
  conv.Bind(0, w.data(), gw.data());
  conv.Bind(1, b.data(), gb.data());
  std::vector<float> y(16);
  conv.Forward(kHandInput.data(), y.data(), 1, /*training=*/false);
  // The interior is the 'valid' result.
  EXPECT_EQ(y[1 * 4 + 1], 2.5f);
  EXPECT_EQ(y[1 * 4 + 2], 8.5f);
  EXPECT_EQ(y[2 * 4 + 1], -3.5f);
  EXPECT_EQ(y[2 * 4 + 2], 0.5f);
  // Corners see only a 2x2 part of the kernel (the rest falls on the zero
  // padding): (0,0): in[0][0]*2 + in[0][1]*0 + in[1][0]*0 + in[1][1]*1 = 2 + 1
  // = 3    -> 3.5 (0,3): in[0][2]*0 + in[0][3]*2 + in[1][2]*-1 + in[1][3]*0 = 2
  // - 3 = -1  -> -0.5 (3,0): in[2][0]*0 + in[2][1]*-1 + in[3][0]*2 + in[3][1]*0
  // = 0 + 2 = 2   -> 2.5 (3,3): in[2][2]*1 + in[2][3]*0 + in[3][2]*0 +
  // in[3][3]*2 = 1 + 4 = 5    -> 5.5
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[3], -0.5f);
  EXPECT_EQ(y[12], 2.5f);
  EXPECT_EQ(y[15], 5.5f);
  // An edge: (0,1): in[0][0]*0 + in[0][1]*2 + in[0][2]*0 + in[1][0]*-1 +
  // in[1][1]*0 + in[1][2]*1 = 4 - 0 + 3 = 7 -> 7.5
  EXPECT_EQ(y[1], 7.5f);
}

// Winograd F(2x2, 3x3) takes over 3x3 kernels once there are enough input
// channels for its GEMMs; a first layer on one channel, and 5x5 kernels, keep
// the patch GEMM. Both paths are checked by the shape cases below.
TEST(Conv2DTest, ThreeByThreeKernelsOverSeveralChannelsRunAsWinograd) {
  using P = Conv2D::Padding;
  const auto winograd = [](int in_c, int kernel, P padding) {
    Conv2D conv(8, kernel, padding);
    conv.Init(Shape{in_c, 10, 10, true});
    return conv.uses_winograd();
  };
  EXPECT_TRUE(winograd(32, 3, P::kValid));
  EXPECT_TRUE(winograd(Conv2D::kWinogradMinChannels, 3, P::kSame));
  EXPECT_FALSE(winograd(Conv2D::kWinogradMinChannels - 1, 3, P::kValid));
  EXPECT_FALSE(winograd(1, 3, P::kValid));
  EXPECT_FALSE(winograd(32, 5, P::kSame));
}

// mnist_cnn's second layer at full size (32 -> 64 channels, 26x26 -> 24x24),
// forward and backward, against the direct sums in double: 288 products per
// output, 1,728 per weight gradient. Winograd runs one sample of this layer
// at a time: the three samples take three chunks, and dW is summed over
// them, on one thread, and on two sharing the chunks out.
class WinogradAtMnistSizeTest : public ::testing::TestWithParam<int> {};

TEST_P(WinogradAtMnistSizeTest, MatchesDirectConvolution) {
  const int threads_before = Eigen::nbThreads();
  SetComputeThreads(GetParam());
  ASSERT_EQ(Eigen::nbThreads(), GetParam());
  std::mt19937 rng(5);
  Conv2D conv(64, 3, Conv2D::Padding::kValid);
  const Shape in{32, 26, 26, true};
  const Shape out = conv.Init(in);
  ASSERT_TRUE(conv.uses_winograd());
  const int batch = 3;
  conv.Reserve(1);  // less than the batch: the workspaces grow on demand
  Parameters p = BindRandomParameters(&conv, 0.1f, &rng);
  const std::vector<float> x = Uniform(batch * in.size(), 0, 1, &rng);
  const std::vector<float> dy = Uniform(batch * out.size(), -1, 1, &rng);
  std::vector<float> y(batch * out.size()), dx(x.size());
  conv.Forward(x.data(), y.data(), batch, /*training=*/true);
  conv.Backward(x.data(), y.data(), dy.data(), dx.data(), batch);

  const std::vector<double> want_y =
      ReferenceConv(x, in, batch, p.values[0], p.values[1], 64, 3, 0);
  std::vector<double> want_dw(p.values[0].size()), want_dx(x.size());
  for (int o = 0; o < 64; ++o) {
    for (int b = 0; b < batch; ++b) {
      for (int64_t oy = 0; oy < out.h; ++oy) {
        for (int64_t ox = 0; ox < out.w; ++ox) {
          const double g = dy[Cnhw(out, batch, o, b, oy, ox)];
          for (int64_t i = 0; i < in.c; ++i) {
            for (int ky = 0; ky < 3; ++ky) {
              for (int kx = 0; kx < 3; ++kx) {
                const size_t w = ((o * in.c + i) * 3 + ky) * 3 + kx;
                const size_t at = Cnhw(in, batch, i, b, oy + ky, ox + kx);
                want_dw[w] += g * x[at];
                want_dx[at] += g * p.values[0][w];
              }
            }
          }
        }
      }
    }
  }
  // Largest error over largest value: rounding in a float sum grows with the
  // size of its terms, so a sum that cancels to near zero is not held to a
  // relative bound of its own.
  const auto worst = [](const std::vector<float>& got,
                        const std::vector<double>& want) {
    double error = 0, scale = 1;
    for (size_t i = 0; i < got.size(); ++i) {
      error = std::max(error, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    return error / scale;
  };
  // Measured: 2.7e-7, 4.1e-7 and 2.9e-7.
  EXPECT_LT(worst(y, want_y), 3e-6) << "output";
  EXPECT_LT(worst(p.grads[0], want_dw), 3e-6) << "dL/dW";
  EXPECT_LT(worst(dx, want_dx), 3e-6) << "dL/d(in)";
  SetComputeThreads(threads_before);
}

INSTANTIATE_TEST_SUITE_P(Threads, WinogradAtMnistSizeTest,
                         ::testing::Values(1, 2));

// Agents in one process: while one is inside its Winograd layer (a
// SingleThreadedGemm scope, which drops Eigen's count to 1 process-wide),
// another's layer still shares its work out over the agents' thread count, so
// its sums run in the same order and its results are the same to the bit
// whatever the other agent is doing.
TEST(Conv2DTest, WinogradSumsAlikeWhileAnotherAgentIsInsideItsLayer) {
  const int threads_before = Eigen::nbThreads();
  SetComputeThreads(2);
  std::mt19937 rng(11);
  Conv2D conv(16, 3, Conv2D::Padding::kSame);
  const Shape in{8, 12, 12, true};
  const Shape out = conv.Init(in);
  ASSERT_TRUE(conv.uses_winograd());
  const int batch = 6;
  Parameters p = BindRandomParameters(&conv, 0.1f, &rng);
  const std::vector<float> x = Uniform(batch * in.size(), 0, 1, &rng);
  const std::vector<float> dy = Uniform(batch * out.size(), -1, 1, &rng);
  auto weight_grad = [&] {
    std::vector<float> y(batch * out.size()), dx(x.size());
    conv.Forward(x.data(), y.data(), batch, /*training=*/true);
    conv.Backward(x.data(), y.data(), dy.data(), dx.data(), batch);
    return p.grads[0];
  };
  const std::vector<float> alone = weight_grad();
  std::vector<float> beside;
  {
    SingleThreadedGemm other_agent;
    ASSERT_EQ(Eigen::nbThreads(), 1);
    beside = weight_grad();
  }
  ASSERT_EQ(alone.size(), beside.size());
  EXPECT_EQ(
      std::memcmp(alone.data(), beside.data(), alone.size() * sizeof(float)),
      0);
  SetComputeThreads(threads_before);
}

struct ConvCase {
  int in_c, out_c, kernel;
  Conv2D::Padding padding;
  int batch;
  int h = 6, w = 7;
};

class Conv2DCaseTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2DCaseTest, ForwardMatchesDirectConvolution) {
  const ConvCase& c = GetParam();
  std::mt19937 rng(7);
  Conv2D conv(c.out_c, c.kernel, c.padding);
  const Shape in{c.in_c, c.h, c.w, true};
  const Shape out = conv.Init(in);
  conv.Reserve(c.batch);
  Parameters p = BindRandomParameters(&conv, 0.5f, &rng);
  const std::vector<float> x = Uniform(c.batch * in.size(), -1, 1, &rng);
  std::vector<float> y(c.batch * out.size());
  conv.Forward(x.data(), y.data(), c.batch, /*training=*/true);
  const int pad = c.padding == Conv2D::Padding::kSame ? (c.kernel - 1) / 2 : 0;
  const std::vector<double> want = ReferenceConv(
      x, in, c.batch, p.values[0], p.values[1], c.out_c, c.kernel, pad);
  ASSERT_EQ(y.size(), want.size());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], want[i], 1e-5 * (1 + std::abs(want[i])))
        << "element " << i;
  }
}

TEST_P(Conv2DCaseTest, GradientsMatchFiniteDifferences) {
  const ConvCase& c = GetParam();
  std::mt19937 rng(11);
  Conv2D conv(c.out_c, c.kernel, c.padding);
  const Shape in{c.in_c, c.h, c.w, true};
  const Shape out = conv.Init(in);
  Parameters p = BindRandomParameters(&conv, 0.5f, &rng);
  // The layer is linear in x and in the parameters, so the central difference
  // has no truncation error; a larger step only shrinks the share of rounding
  // noise.
  ExpectGradientsMatch(CheckGradients(
      &conv, out, c.batch, Uniform(c.batch * in.size(), -1, 1, &rng), &p,
      /*training=*/true, /*step=*/0.05f));
}

// Backward writes the parameter gradients (it does not add to what was there),
// and the first layer of a network, which gets din == nullptr, gets the same
// ones.
TEST_P(Conv2DCaseTest, BackwardOverwritesGradientsWithOrWithoutInputGradient) {
  const ConvCase& c = GetParam();
  std::mt19937 rng(13);
  Conv2D conv(c.out_c, c.kernel, c.padding);
  const Shape in{c.in_c, c.h, c.w, true};
  const Shape out = conv.Init(in);
  conv.Reserve(c.batch);
  Parameters p = BindRandomParameters(&conv, 0.5f, &rng);
  const std::vector<float> x = Uniform(c.batch * in.size(), -1, 1, &rng);
  const std::vector<float> dy = Uniform(c.batch * out.size(), -1, 1, &rng);
  std::vector<float> y(dy.size()), dx(x.size());
  conv.Forward(x.data(), y.data(), c.batch, true);
  conv.Backward(x.data(), y.data(), dy.data(), dx.data(), c.batch);
  const Parameters once = p;
  for (auto& g : p.grads) std::fill(g.begin(), g.end(), 1e9f);
  conv.Backward(x.data(), y.data(), dy.data(), nullptr, c.batch);
  EXPECT_THAT(p.grads[0], Pointwise(FloatEq(), once.grads[0]));
  EXPECT_THAT(p.grads[1], Pointwise(FloatEq(), once.grads[1]));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Conv2DCaseTest,
    ::testing::Values(ConvCase{2, 3, 3, Conv2D::Padding::kValid, 2},
                      ConvCase{3, 2, 3, Conv2D::Padding::kSame, 3},
                      ConvCase{2, 4, 5, Conv2D::Padding::kSame, 2},
                      ConvCase{3, 2, 5, Conv2D::Padding::kValid, 3},
                      ConvCase{1, 3, 3, Conv2D::Padding::kValid, 1},
                      ConvCase{1, 2, 5, Conv2D::Padding::kSame, 2, 4, 3},
                      // Winograd F(2x2, 3x3): even and odd output sizes (a
                      // last tile half outside), valid and same padding.
                      ConvCase{4, 3, 3, Conv2D::Padding::kValid, 2, 6, 8},
                      ConvCase{5, 2, 3, Conv2D::Padding::kValid, 3, 7, 6},
                      ConvCase{6, 4, 3, Conv2D::Padding::kSame, 2, 5, 7},
                      ConvCase{4, 3, 3, Conv2D::Padding::kSame, 2, 6, 8},
                      ConvCase{4, 3, 3, Conv2D::Padding::kSame, 1, 3, 3}),
    [](const ::testing::TestParamInfo<ConvCase>& info) {
      const ConvCase& c = info.param;
      return "In" + std::to_string(c.in_c) + "Out" + std::to_string(c.out_c) +
             "K" + std::to_string(c.kernel) +
             (c.padding == Conv2D::Padding::kSame ? "Same" : "Valid") + "B" +
             std::to_string(c.batch) + "H" + std::to_string(c.h) + "W" +
             std::to_string(c.w);
    });

// Results must not depend on where the caller's buffers sit: a network's
// activations, parameters and gradients live in heap buffers whose alignment
// varies between instances and runs, and training with a fixed seed is meant
// to be reproducible bit for bit. Runs Forward and Backward with in, out,
// dout, din and every parameter and gradient tensor placed at every float
// offset within a 64-byte line and compares all outputs bitwise with offset 0.
void ExpectAlignmentIndependent(Layer* layer, const Shape& in, const Shape& out,
                                int batch) {
  std::mt19937 rng(61);
  layer->Reserve(batch);
  const Parameters p = BindRandomParameters(layer, 0.5f, &rng);
  const std::vector<float> x = Uniform(batch * in.size(), -1, 1, &rng);
  const std::vector<float> dy = Uniform(batch * out.size(), -1, 1, &rng);
  // Storage with room for a shift of up to 15 floats, itself 64-byte aligned.
  struct alignas(64) Line {
    float f[16];
  };
  auto lines = [](size_t floats) { return std::vector<Line>(floats / 16 + 2); };
  std::vector<Line> xs = lines(x.size()), ys = lines(dy.size()),
                    dys = lines(dy.size()), dxs = lines(x.size());
  std::vector<std::vector<Line>> ws, gs;
  for (const std::vector<float>& values : p.values) {
    ws.push_back(lines(values.size()));
    gs.push_back(lines(values.size()));
  }
  std::vector<float> y0, dx0;
  std::vector<std::vector<float>> grads0;
  for (int shift = 0; shift < 16; ++shift) {
    SCOPED_TRACE(::testing::Message()
                 << "buffers shifted by " << shift << " floats");
    float* xp = xs[0].f + shift;
    float* yp = ys[0].f + shift;
    float* dyp = dys[0].f + shift;
    float* dxp = dxs[0].f + shift;
    std::copy(x.begin(), x.end(), xp);
    std::copy(dy.begin(), dy.end(), dyp);
    for (size_t t = 0; t < p.values.size(); ++t) {
      float* wp = ws[t][0].f + shift;
      float* gp = gs[t][0].f + shift;
      std::copy(p.values[t].begin(), p.values[t].end(), wp);
      std::fill(gp, gp + p.values[t].size(), 0.0f);
      layer->Bind(static_cast<int>(t), wp, gp);
    }
    layer->Forward(xp, yp, batch, /*training=*/false);
    layer->Backward(xp, yp, dyp, dxp, batch);
    const std::vector<float> y(yp, yp + dy.size()), dx(dxp, dxp + x.size());
    std::vector<std::vector<float>> grads;
    for (size_t t = 0; t < p.values.size(); ++t) {
      const float* gp = gs[t][0].f + shift;
      grads.emplace_back(gp, gp + p.values[t].size());
    }
    if (shift == 0) {
      y0 = y, dx0 = dx, grads0 = grads;
      continue;
    }
    EXPECT_EQ(std::memcmp(y.data(), y0.data(), y.size() * 4), 0) << "output";
    EXPECT_EQ(std::memcmp(dx.data(), dx0.data(), dx.size() * 4), 0)
        << "dL/d(in)";
    for (size_t t = 0; t < grads0.size(); ++t) {
      int differing = 0;
      for (size_t i = 0; i < grads0[t].size(); ++i) {
        differing += std::memcmp(&grads[t][i], &grads0[t][i], 4) != 0;
      }
      EXPECT_EQ(differing, 0) << "of " << grads0[t].size()
                              << " gradients of parameter tensor " << t;
    }
  }
}

TEST(Conv2DTest, ResultsDoNotDependOnBufferAlignment) {
  // The first layer of mnist_cnn, batch 4.
  Conv2D conv(32, 3, Conv2D::Padding::kValid);
  const Shape in{1, 28, 28, true};
  const Shape out = conv.Init(in);
  ExpectAlignmentIndependent(&conv, in, out, 4);
}

TEST(Conv2DTest, WinogradResultsDoNotDependOnBufferAlignment) {
  // The second layer of mnist_cnn, batch 2.
  Conv2D conv(64, 3, Conv2D::Padding::kValid);
  const Shape in{32, 26, 26, true};
  const Shape out = conv.Init(in);
  ASSERT_TRUE(conv.uses_winograd());
  ExpectAlignmentIndependent(&conv, in, out, 2);
}

TEST(DenseTest, ResultsDoNotDependOnBufferAlignment) {
  Dense dense(200);
  const Shape in{784, 1, 1, false};
  const Shape out = dense.Init(in);
  ExpectAlignmentIndependent(&dense, in, out, 10);
}

// ---------------------------------------------------------------------------------------
// Dense

TEST(DenseTest, ForwardByHand) {
  Dense dense(2);
  const Shape out = dense.Init(Shape{3, 1, 1, false});
  EXPECT_EQ(out.c, 2);
  EXPECT_FALSE(out.spatial);
  ASSERT_EQ(dense.parameter_size(0), 6);
  ASSERT_EQ(dense.parameter_size(1), 2);
  // W [out, in] = [[1, 2, 3], [-1, 0, 1]], b = [0.5, -0.5].
  std::vector<float> w = {1, 2, 3, -1, 0, 1}, b = {0.5f, -0.5f}, gw(6), gb(2);
  dense.Bind(0, w.data(), gw.data());
  dense.Bind(1, b.data(), gb.data());
  // Two samples, one column each: x0 = (1, 1, 1), x1 = (2, 0, -1).
  const std::vector<float> x = {1, 1, 1, 2, 0, -1};
  std::vector<float> y(4);
  dense.Forward(x.data(), y.data(), 2, false);
  // y0 = (1+2+3+0.5, -1+0+1-0.5) = (6.5, -0.5); y1 = (2+0-3+0.5, -2+0-1-0.5) =
  // (-0.5, -3.5)
  EXPECT_THAT(y, ElementsAreArray({6.5f, -0.5f, -0.5f, -3.5f}));
}

TEST(DenseTest, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(17);
  Dense dense(5);
  const Shape in{7, 1, 1, false};
  const Shape out = dense.Init(in);
  Parameters p = BindRandomParameters(&dense, 0.5f, &rng);
  ExpectGradientsMatch(CheckGradients(&dense, out, 3,
                                      Uniform(3 * 7, -1, 1, &rng), &p,
                                      /*training=*/true, /*step=*/0.05f));
}

// ---------------------------------------------------------------------------------------
// ReLU

TEST(ReLUTest, Forward) {
  ReLU relu;
  relu.Init(Shape{3, 1, 1, false});
  const std::vector<float> x = {-1.5f, 0.0f, 2.0f, 3.0f, -0.25f, 0.125f};
  std::vector<float> y(6);
  relu.Forward(x.data(), y.data(), 2, false);
  EXPECT_THAT(y, ElementsAreArray({0.0f, 0.0f, 2.0f, 3.0f, 0.0f, 0.125f}));
}

TEST(ReLUTest, GradientsMatchFiniteDifferencesSpatial) {
  std::mt19937 rng(19);
  ReLU relu;
  const Shape in{3, 4, 5, true};
  const Shape out = relu.Init(in);
  Parameters none;
  // Inputs at least 0.1 from the kink; the step is 0.01.
  ExpectGradientsMatch(CheckGradients(
      &relu, out, 2, AwayFromZero(2 * in.size(), 0.1f, 1.0f, &rng), &none,
      /*training=*/true, /*step=*/0.01f));
}

TEST(ReLUTest, GradientsMatchFiniteDifferencesFlat) {
  std::mt19937 rng(23);
  ReLU relu;
  const Shape in{9, 1, 1, false};
  const Shape out = relu.Init(in);
  Parameters none;
  ExpectGradientsMatch(CheckGradients(
      &relu, out, 3, AwayFromZero(3 * in.size(), 0.1f, 1.0f, &rng), &none,
      /*training=*/true, /*step=*/0.01f));
}

// ---------------------------------------------------------------------------------------
// MaxPool2D

TEST(MaxPool2DTest, ForwardAndBackwardByHand) {
  MaxPool2D pool;
  // 4 x 5: the odd last column is dropped (Keras 'valid').
  const Shape out = pool.Init(Shape{1, 4, 5, true});
  EXPECT_EQ(out.c, 1);
  EXPECT_EQ(out.h, 2);
  EXPECT_EQ(out.w, 2);
  EXPECT_TRUE(out.spatial);
  pool.Reserve(1);
  const std::vector<float> x = {1, 5, 2, 0, 9,  //
                                3, 4, 8, 6, 9,  //
                                7, 0, 1, 2, 9,  //
                                2, 6, 3, 2, 9};
  std::vector<float> y(4);
  pool.Forward(x.data(), y.data(), 1, false);
  // Windows {1 5 3 4} {2 0 8 6} {7 0 2 6} {1 2 3 2}.
  EXPECT_THAT(y, ElementsAreArray({5.0f, 8.0f, 7.0f, 3.0f}));
  const std::vector<float> dy = {1, 2, 3, 4};
  std::vector<float> dx(20, -1.0f);
  pool.Backward(x.data(), y.data(), dy.data(), dx.data(), 1);
  // Each window's gradient goes to its winner; every other input (and the
  // dropped column) gets 0.
  EXPECT_THAT(dx, ElementsAreArray({0.0f, 1.0f, 0.0f, 0.0f, 0.0f,  //
                                    0.0f, 0.0f, 2.0f, 0.0f, 0.0f,  //
                                    3.0f, 0.0f, 0.0f, 0.0f, 0.0f,  //
                                    0.0f, 0.0f, 4.0f, 0.0f, 0.0f}));
}

TEST(MaxPool2DTest, TiesSendTheGradientToTheFirstInWindowOrder) {
  MaxPool2D pool;
  pool.Init(Shape{1, 2, 8, true});
  pool.Reserve(1);
  // Four windows, in order 0 1 / 2 3: all equal; 1, 2 and 3 tie; 2 and 3
  // tie; only 3 is the maximum.
  const std::vector<float> x = {7, 7, 1, 3, 0, 1, 0, 1,  //
                                7, 7, 3, 3, 4, 4, 0, 2};
  std::vector<float> y(4);
  pool.Forward(x.data(), y.data(), 1, true);
  EXPECT_THAT(y, ElementsAreArray({7.0f, 3.0f, 4.0f, 2.0f}));
  const std::vector<float> dy = {1, 2, 3, 4};
  std::vector<float> dx(16, -1.0f);
  pool.Backward(x.data(), y.data(), dy.data(), dx.data(), 1);
  EXPECT_THAT(
      dx, ElementsAreArray({1.0f, 0.0f, 0.0f, 2.0f, 0.0f, 0.0f, 0.0f,
                            0.0f,  //
                            0.0f, 0.0f, 0.0f, 0.0f, 3.0f, 0.0f, 0.0f, 4.0f}));
}

// The same rule on rows wide enough for the vectorised loop (12 windows a row,
// as mnist_cnn's second pooling has): values from {0, 1, 2}, so most windows
// tie, against a plain scalar reference.
TEST(MaxPool2DTest, TiesAreBrokenTheSameWayOnWideRows) {
  const Shape in{3, 6, 24, true};
  const int batch = 2;
  MaxPool2D pool;
  const Shape out = pool.Init(in);
  pool.Reserve(batch);
  std::mt19937 rng(5);
  std::vector<float> x(batch * in.size());
  for (float& v : x) v = static_cast<float>(rng() % 3);
  std::vector<float> dy(batch * out.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 1.0f + static_cast<float>(i);
  std::vector<float> y(dy.size()), dx(x.size(), -1.0f);
  pool.Forward(x.data(), y.data(), batch, true);
  pool.Backward(x.data(), y.data(), dy.data(), dx.data(), batch);

  std::vector<float> want_y(y.size()), want_dx(x.size(), 0.0f);
  for (int p = 0; p < in.c * batch; ++p) {
    for (int oy = 0; oy < out.h; ++oy) {
      for (int ox = 0; ox < out.w; ++ox) {
        const int o = (p * out.h + oy) * out.w + ox;
        int best = -1;
        for (int k = 0; k < 4; ++k) {  // window order 0 1 / 2 3
          const int i = (p * in.h + 2 * oy + k / 2) * in.w + 2 * ox + k % 2;
          if (best < 0 || x[i] > x[best]) best = i;
        }
        want_y[o] = x[best];
        want_dx[best] = dy[o];
      }
    }
  }
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(dx, want_dx);
}

// Distinct values at least 0.05 apart in random order: no ties, and a step of
// 0.01 cannot change any window's winner.
std::vector<float> DistinctValues(size_t n, std::mt19937* rng) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = -1.0f + 0.05f * static_cast<float>(i);
  std::shuffle(v.begin(), v.end(), *rng);
  return v;
}

TEST(MaxPool2DTest, ForwardMatchesReference) {
  std::mt19937 rng(29);
  MaxPool2D pool;
  const Shape in{3, 6, 7, true};
  const int batch = 2;
  const Shape out = pool.Init(in);
  ASSERT_EQ(out.h, 3);
  ASSERT_EQ(out.w, 3);
  pool.Reserve(batch);
  const std::vector<float> x = DistinctValues(batch * in.size(), &rng);
  std::vector<float> y(batch * out.size());
  pool.Forward(x.data(), y.data(), batch, false);
  for (int64_t c = 0; c < in.c; ++c) {
    for (int b = 0; b < batch; ++b) {
      for (int64_t oy = 0; oy < out.h; ++oy) {
        for (int64_t ox = 0; ox < out.w; ++ox) {
          const float want =
              std::max({x[Cnhw(in, batch, c, b, 2 * oy, 2 * ox)],
                        x[Cnhw(in, batch, c, b, 2 * oy, 2 * ox + 1)],
                        x[Cnhw(in, batch, c, b, 2 * oy + 1, 2 * ox)],
                        x[Cnhw(in, batch, c, b, 2 * oy + 1, 2 * ox + 1)]});
          EXPECT_EQ(y[Cnhw(out, batch, c, b, oy, ox)], want);
        }
      }
    }
  }
}

TEST(MaxPool2DTest, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(31);
  MaxPool2D pool;
  const Shape in{3, 6, 7, true};  // odd width: the last column gets no gradient
  const Shape out = pool.Init(in);
  Parameters none;
  ExpectGradientsMatch(
      CheckGradients(&pool, out, 2, DistinctValues(2 * in.size(), &rng), &none,
                     /*training=*/true, /*step=*/0.01f));
}

// ---------------------------------------------------------------------------------------
// Dropout

TEST(DropoutTest, GradientsMatchFiniteDifferencesInTraining) {
  std::mt19937 rng(37);
  Dropout dropout(0.5f, 5);
  const Shape in{3, 4, 5, true};
  const int batch = 2;
  const Shape out = dropout.Init(in);
  Parameters none;
  // Reseeding before every forward pass draws the same mask each time.
  ExpectGradientsMatch(CheckGradients(
      &dropout, out, batch, Uniform(batch * in.size(), -1, 1, &rng), &none,
      /*training=*/true, /*step=*/0.01f, [&dropout] { dropout.Reseed(1234); }));

  // And the mask is not trivial: about half the elements are dropped, the rest
  // doubled.
  dropout.Reseed(1234);
  const std::vector<float> x = Uniform(batch * in.size(), 0.5f, 1.0f, &rng);
  std::vector<float> y(x.size());
  dropout.Forward(x.data(), y.data(), batch, /*training=*/true);
  int dropped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f) {
      ++dropped;
    } else {
      EXPECT_EQ(y[i], 2.0f * x[i]);
    }
  }
  EXPECT_GT(dropped, 30);
  EXPECT_LT(dropped, 90);
}

TEST(DropoutTest, BackwardUsesTheForwardMask) {
  std::mt19937 rng(41);
  Dropout dropout(0.25f, 9);
  const Shape in{50, 1, 1, false};
  dropout.Init(in);
  dropout.Reserve(4);
  const std::vector<float> x = Uniform(200, 0.5f, 1.0f, &rng);
  const std::vector<float> dy = Uniform(200, 0.5f, 1.0f, &rng);
  std::vector<float> y(200), dx(200);
  dropout.Forward(x.data(), y.data(), 4, /*training=*/true);
  dropout.Backward(x.data(), y.data(), dy.data(), dx.data(), 4);
  const float scale = 1.0f / 0.75f;
  for (size_t i = 0; i < 200; ++i) {
    if (y[i] == 0.0f) {
      EXPECT_EQ(dx[i], 0.0f) << i;
    } else {
      EXPECT_EQ(y[i], x[i] * scale) << i;
      EXPECT_EQ(dx[i], dy[i] * scale) << i;
    }
  }
}

TEST(DropoutTest, InferenceIsTheIdentity) {
  std::mt19937 rng(43);
  Dropout dropout(0.5f, 3);
  const Shape in{2, 3, 4, true};
  const Shape out = dropout.Init(in);
  dropout.Reserve(3);
  const std::vector<float> x = Uniform(3 * in.size(), -1, 1, &rng);
  std::vector<float> y(x.size()), dx(x.size());
  dropout.Forward(x.data(), y.data(), 3, /*training=*/false);
  EXPECT_EQ(y, x);
  const std::vector<float> dy = Uniform(x.size(), -1, 1, &rng);
  dropout.Backward(x.data(), y.data(), dy.data(), dx.data(), 3);
  EXPECT_EQ(dx, dy);

  Parameters none;
  ExpectGradientsMatch(CheckGradients(&dropout, out, 3, x, &none,
                                      /*training=*/false, /*step=*/0.01f));
}

TEST(DropoutTest, RateZeroIsTheIdentityInTraining) {
  Dropout dropout(0.0f, 3);
  dropout.Init(Shape{4, 1, 1, false});
  dropout.Reserve(2);
  const std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8};
  std::vector<float> y(8);
  dropout.Forward(x.data(), y.data(), 2, /*training=*/true);
  EXPECT_EQ(y, x);
}

TEST(DropoutTest, DropsAboutRateOfTheElementsAndReseedRepeatsTheMask) {
  std::mt19937 rng(47);
  const int n = 100000;
  Dropout dropout(0.25f, 77);
  dropout.Init(Shape{n, 1, 1, false});
  dropout.Reserve(1);
  const std::vector<float> x(n, 1.0f);
  std::vector<float> first(n), second(n), again(n);
  dropout.Forward(x.data(), first.data(), 1, true);
  dropout.Forward(x.data(), second.data(), 1, true);
  const auto count_dropped = [](const std::vector<float>& y) {
    return std::count(y.begin(), y.end(), 0.0f);
  };
  EXPECT_NEAR(count_dropped(first) / static_cast<double>(n), 0.25, 0.01);
  EXPECT_NEAR(count_dropped(second) / static_cast<double>(n), 0.25, 0.01);
  EXPECT_NE(first, second);  // the generator moves on between batches
  dropout.Reseed(77);
  dropout.Forward(x.data(), again.data(), 1, true);
  EXPECT_EQ(again, first);  // same seed, same mask
}

// ---------------------------------------------------------------------------------------
// Flatten

TEST(FlattenTest, SpatialToOneColumnPerSampleInCYXOrder) {
  Flatten flatten;
  const Shape in{3, 2, 2, true};
  const Shape out = flatten.Init(in);
  EXPECT_EQ(out.c, 12);
  EXPECT_EQ(out.h, 1);
  EXPECT_EQ(out.w, 1);
  EXPECT_FALSE(out.spatial);
  const int batch = 2;
  std::vector<float> x(batch * in.size());
  std::iota(x.begin(), x.end(), 0.0f);
  std::vector<float> y(x.size());
  flatten.Forward(x.data(), y.data(), batch, false);
  for (int b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < in.c; ++c) {
      for (int64_t p = 0; p < 4; ++p) {
        EXPECT_EQ(y[b * 12 + c * 4 + p],
                  x[Cnhw(in, batch, c, b, p / 2, p % 2)]);
      }
    }
  }
}

TEST(FlattenTest, GradientsMatchFiniteDifferencesSpatial) {
  std::mt19937 rng(53);
  for (int batch : {1, 3}) {
    SCOPED_TRACE(batch);
    Flatten flatten;
    const Shape in{3, 4, 5, true};
    const Shape out = flatten.Init(in);
    Parameters none;
    ExpectGradientsMatch(CheckGradients(
        &flatten, out, batch, Uniform(batch * in.size(), -1, 1, &rng), &none,
        /*training=*/true, /*step=*/0.01f));
  }
}

TEST(FlattenTest, FlatInputIsTheIdentity) {
  std::mt19937 rng(59);
  Flatten flatten;
  const Shape in{6, 1, 1, false};
  const Shape out = flatten.Init(in);
  EXPECT_EQ(out.c, 6);
  EXPECT_FALSE(out.spatial);
  const std::vector<float> x = Uniform(18, -1, 1, &rng);
  std::vector<float> y(18);
  flatten.Forward(x.data(), y.data(), 3, false);
  EXPECT_EQ(y, x);
  Parameters none;
  ExpectGradientsMatch(CheckGradients(&flatten, out, 3, x, &none,
                                      /*training=*/true, /*step=*/0.01f));
}

}  // namespace
}  // namespace fedlearn::nn
