#include "client/nn/network.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/nn/dropout.h"
#include "client/nn/optimizer.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn::nn {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Network> MakeNetwork(const std::string& model, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Network>> net = Network::Create(model, seed);
  EXPECT_TRUE(net.ok()) << net.status();
  return net.ok() ? *std::move(net) : nullptr;
}

std::unique_ptr<Optimizer> MakeOpt(const std::string& name, float lr,
                                   size_t n) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = MakeOptimizer(name, lr, n);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

struct Batch {
  int size = 0;
  std::vector<float> images;  // size x 784, image after image
  std::vector<uint8_t> labels;
};

// Images whose label is told by where a bright 8x5 block sits (ten places: two
// rows of five), on faint noise; labels cycle 0..9. Linearly separable, so any
// of the models fits it quickly.
Batch SeparableBatch(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.2f), ink(0.8f, 1.0f);
  Batch batch;
  batch.size = n;
  batch.images.resize(static_cast<size_t>(n) * Network::kImageSize);
  for (int i = 0; i < n; ++i) {
    const int label = i % Network::kClasses;
    batch.labels.push_back(static_cast<uint8_t>(label));
    float* image = batch.images.data() + i * Network::kImageSize;
    const int top = 3 + (label / 5) * 14, left = 1 + (label % 5) * 5;
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) {
        const bool in_block =
            y >= top && y < top + 8 && x >= left && x < left + 5;
        image[y * 28 + x] = in_block ? ink(rng) : noise(rng);
      }
    }
  }
  return batch;
}

// Random pixels in [0, 1] and random labels.
Batch RandomBatch(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, Network::kClasses - 1);
  Batch batch;
  batch.size = n;
  batch.images.resize(static_cast<size_t>(n) * Network::kImageSize);
  for (float& p : batch.images) p = pixel(rng);
  for (int i = 0; i < n; ++i)
    batch.labels.push_back(static_cast<uint8_t>(label(rng)));
  return batch;
}

TEST(NetworkTest, ParameterCounts) {
  for (const auto& [model, count] :
       std::vector<std::pair<std::string, int64_t>>{{"mnist_cnn", 1199882},
                                                    {"fedavg_cnn", 1663370},
                                                    {"mlp_2nn", 199210}}) {
    SCOPED_TRACE(model);
    std::unique_ptr<Network> net = MakeNetwork(model, 1);
    ASSERT_NE(net, nullptr);
    EXPECT_EQ(net->spec().name, model);
    EXPECT_EQ(net->spec().num_parameters, count);
    EXPECT_EQ(static_cast<int64_t>(net->parameters().size()), count);
    EXPECT_EQ(static_cast<int64_t>(net->gradients().size()), count);
  }
}

TEST(NetworkTest, UnknownModelIsNotFound) {
  absl::StatusOr<std::unique_ptr<Network>> net = Network::Create("resnet50", 1);
  EXPECT_EQ(net.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(net.status().message(), HasSubstr("resnet50"));
}

TEST(NetworkTest, InitialParametersAreTheRegistryInitialisation) {
  for (const std::string model : {"mnist_cnn", "fedavg_cnn", "mlp_2nn"}) {
    SCOPED_TRACE(model);
    std::unique_ptr<Network> net = MakeNetwork(model, 42);
    ASSERT_NE(net, nullptr);
    absl::StatusOr<ModelSpec> spec = LookupModel(model);
    ASSERT_TRUE(spec.ok());
    std::vector<float> want(spec->num_parameters);
    InitializeParameters(*spec, 42, absl::MakeSpan(want));
    ASSERT_EQ(net->parameters().size(), want.size());
    EXPECT_EQ(std::memcmp(net->parameters().data(), want.data(),
                          want.size() * sizeof(float)),
              0);
  }
}

// Bit for bit: nothing may depend on anything but the seed and the data (in
// particular not on where the heap puts the workspaces; see the
// ResultsDoNotDependOnBufferAlignment tests in layers_test.cc).
TEST(NetworkTest, SameSeedSameTrajectoryDifferentSeedDiffers) {
  // mnist_cnn has dropout: the masks come from the seed too.
  const Batch batch = SeparableBatch(6, 5);
  std::unique_ptr<Network> a = MakeNetwork("mnist_cnn", 7);
  std::unique_ptr<Network> b = MakeNetwork("mnist_cnn", 7);
  std::unique_ptr<Network> c = MakeNetwork("mnist_cnn", 8);
  ASSERT_TRUE(a && b && c);
  const size_t n = a->parameters().size();
  const size_t bytes = n * sizeof(float);
  EXPECT_EQ(std::memcmp(a->parameters().data(), b->parameters().data(), bytes),
            0);
  EXPECT_NE(std::memcmp(a->parameters().data(), c->parameters().data(), bytes),
            0);

  std::unique_ptr<Optimizer> opt_a = MakeOpt("adadelta", 1.0f, n);
  std::unique_ptr<Optimizer> opt_b = MakeOpt("adadelta", 1.0f, n);
  for (int step = 0; step < 3; ++step) {
    const LossResult ra = a->TrainStep(batch.images.data(), batch.labels.data(),
                                       batch.size, opt_a.get());
    const LossResult rb = b->TrainStep(batch.images.data(), batch.labels.data(),
                                       batch.size, opt_b.get());
    EXPECT_EQ(ra.loss_sum, rb.loss_sum) << "step " << step;
    EXPECT_EQ(ra.correct, rb.correct) << "step " << step;
  }
  EXPECT_EQ(std::memcmp(a->parameters().data(), b->parameters().data(), bytes),
            0);
  EXPECT_EQ(std::memcmp(a->gradients().data(), b->gradients().data(), bytes),
            0);
}

// The same, wherever the heap puts the network's parameters, gradients and
// workspaces: between runs of an agent they land at other addresses, and a
// seed must still give one trajectory. Each copy is made after a throwaway
// allocation of a different size, so its buffers start at other offsets in a
// 64-byte line; all train on a batch of 10 (the plan's default) for 3 steps.
TEST(NetworkTest, SameSeedSameTrajectoryWhereverTheHeapPutsIt) {
  const Batch batch = SeparableBatch(10, 5);
  // glibc serves blocks this large from mmap, page-aligned, unless told not
  // to; an agent's process gets them from the heap too once it has freed
  // some (the threshold adapts), at any 16-byte boundary.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  std::vector<uint8_t> reference;
  std::vector<std::unique_ptr<float[]>> kept;
  std::vector<std::unique_ptr<Network>> nets;
  for (int pad = 0; pad < 16; ++pad) {
    SCOPED_TRACE(::testing::Message() << "after " << pad << " floats");
    auto spacer = std::make_unique<float[]>(static_cast<size_t>(pad) + 1);
    std::unique_ptr<Network> net = MakeNetwork("mnist_cnn", 7);
    ASSERT_TRUE(net);
    const size_t n = net->parameters().size();
    std::unique_ptr<Optimizer> opt = MakeOpt("sgd", 0.05f, n);
    for (int step = 0; step < 3; ++step) {
      net->TrainStep(batch.images.data(), batch.labels.data(), batch.size,
                     opt.get());
    }
    const auto* bytes =
        reinterpret_cast<const uint8_t*>(net->parameters().data());
    std::vector<uint8_t> got(bytes, bytes + n * sizeof(float));
    kept.push_back(std::move(spacer));
    nets.push_back(std::move(net));
    if (pad == 0) {
      reference = std::move(got);
      continue;
    }
    size_t first = 0;
    while (first < got.size() && got[first] == reference[first]) ++first;
    EXPECT_EQ(first, got.size())
        << "first differing parameter " << first / sizeof(float) << " of " << n
        << "; parameters at " << nets.back()->parameters().data();
  }
}

// FedProx (Li et al. 2020): the step's gradient is g + mu (w - anchor). With
// SGD the step can be written out: w' = w - lr (g + mu (w - anchor)), g being
// the plain gradient at w (the same dropout masks: same seed, same step).
TEST(NetworkTest, ProximalStepAddsMuTimesTheDistanceToTheAnchor) {
  const Batch batch = SeparableBatch(6, 5);
  std::unique_ptr<Network> prox = MakeNetwork("mnist_cnn", 7);
  std::unique_ptr<Network> plain = MakeNetwork("mnist_cnn", 7);
  ASSERT_TRUE(prox && plain);
  const size_t n = prox->parameters().size();
  const std::vector<float> w(prox->parameters().begin(),
                             prox->parameters().end());
  std::vector<float> anchor(n);
  for (size_t i = 0; i < n; ++i) {
    anchor[i] = w[i] + 0.01f * static_cast<float>(static_cast<int>(i % 7) - 3);
  }
  const float lr = 0.1f, mu = 0.5f;
  plain->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                          /*training=*/true);
  const std::vector<float> g(plain->gradients().begin(),
                             plain->gradients().end());
  std::unique_ptr<Optimizer> sgd = MakeOpt("sgd", lr, n);
  prox->TrainStep(batch.images.data(), batch.labels.data(), batch.size,
                  sgd.get(), {anchor.data(), mu});
  for (size_t i = 0; i < n; ++i) {
    const double want =
        double{w[i]} -
        double{lr} * (double{g[i]} + double{mu} * (double{w[i]} - anchor[i]));
    ASSERT_NEAR(prox->parameters()[i], want, 1e-6) << i;
  }
}

TEST(NetworkTest, ProximalMuZeroIsPlainTrainingBitForBit) {
  const Batch batch = SeparableBatch(6, 5);
  std::unique_ptr<Network> a = MakeNetwork("mnist_cnn", 3);
  std::unique_ptr<Network> b = MakeNetwork("mnist_cnn", 3);
  ASSERT_TRUE(a && b);
  const size_t n = a->parameters().size();
  const std::vector<float> anchor(n, 1.0f);
  std::unique_ptr<Optimizer> opt_a = MakeOpt("adadelta", 1.0f, n);
  std::unique_ptr<Optimizer> opt_b = MakeOpt("adadelta", 1.0f, n);
  for (int step = 0; step < 2; ++step) {
    a->TrainStep(batch.images.data(), batch.labels.data(), batch.size,
                 opt_a.get(), {anchor.data(), 0.0f});
    b->TrainStep(batch.images.data(), batch.labels.data(), batch.size,
                 opt_b.get());
  }
  EXPECT_EQ(std::memcmp(a->parameters().data(), b->parameters().data(),
                        n * sizeof(float)),
            0);
}

// ||x - y|| / ||x||.
double RelativeDifference(absl::Span<const float> x,
                          absl::Span<const float> y) {
  double diff_sq = 0, norm_sq = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff_sq += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
    norm_sq += double{x[i]} * x[i];
  }
  return std::sqrt(diff_sq / norm_sq);
}

TEST(NetworkTest, DropoutSeedChangesTheTrainingGradient) {
  // Same parameters, different seeds for the dropout masks: the training-mode
  // gradients differ, the inference-mode ones do not. (Not compared bit for bit
  // here: that is the trajectory test's job.)
  const Batch batch = SeparableBatch(4, 6);
  std::unique_ptr<Network> a = MakeNetwork("mnist_cnn", 7);
  std::unique_ptr<Network> c = MakeNetwork("mnist_cnn", 8);
  ASSERT_TRUE(a && c);
  std::copy(a->parameters().begin(), a->parameters().end(),
            c->parameters().begin());
  a->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                      true);
  c->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                      true);
  EXPECT_GT(RelativeDifference(a->gradients(), c->gradients()), 0.05);
  a->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                      false);
  c->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                      false);
  EXPECT_LT(RelativeDifference(a->gradients(), c->gradients()), 1e-6);
}

// Logits are kClasses x batch, one column per sample: a batch's column b is
// what the network gives image b alone.
TEST(NetworkTest, LogitsAreOneColumnPerSample) {
  const Batch batch = RandomBatch(3, 9);
  for (const std::string model : {"mnist_cnn", "fedavg_cnn", "mlp_2nn"}) {
    SCOPED_TRACE(model);
    std::unique_ptr<Network> net = MakeNetwork(model, 3);
    ASSERT_NE(net, nullptr);
    const float* logits = net->Forward(batch.images.data(), batch.size, false);
    const std::vector<float> together(logits,
                                      logits + Network::kClasses * batch.size);
    for (float z : together) ASSERT_TRUE(std::isfinite(z));
    for (int b = 0; b < batch.size; ++b) {
      const float* alone =
          net->Forward(batch.images.data() + b * Network::kImageSize, 1, false);
      for (int k = 0; k < Network::kClasses; ++k) {
        EXPECT_NEAR(alone[k], together[b * Network::kClasses + k],
                    1e-5 * (1 + std::abs(alone[k])))
            << "sample " << b << " class " << k;
      }
    }
    // Evaluate agrees with the logits it is built on.
    const LossResult r =
        net->Evaluate(batch.images.data(), batch.labels.data(), batch.size);
    const LossResult direct =
        SoftmaxCrossEntropy(together.data(), batch.labels.data(),
                            Network::kClasses, batch.size, nullptr);
    EXPECT_NEAR(r.loss_sum, direct.loss_sum, 1e-6 * (1 + direct.loss_sum));
    EXPECT_EQ(r.correct, direct.correct);
  }
}

// A direct double-precision forward pass of one image with PyTorch's semantics:
// NCHW activations, conv weights [out, in, kh, kw], zero padding (k-1)/2 for
// 'same', 2x2 max pooling with odd edges dropped, flatten in (c, y, x) order,
// dense weights [out, in]. What the network computes must be this function, or
// the parameters it exports mean something else to a PyTorch user.
class ReferenceModel {
 public:
  ReferenceModel(const ModelSpec& spec, const float* params)
      : spec_(spec), params_(params) {}

  // `ops`: "conv3v", "conv5s" (kernel, valid/same), "relu", "pool", "flatten",
  // "dense".
  std::vector<double> Logits(const float* image,
                             const std::vector<std::string>& ops) {
    c_ = 1, h_ = 28, w_ = 28;
    x_.assign(image, image + 784);
    tensor_ = 0;
    for (const std::string& op : ops) {
      if (op == "relu") {
        for (double& v : x_) v = std::max(v, 0.0);
      } else if (op == "pool") {
        Pool();
      } else if (op == "flatten") {
        c_ = c_ * h_ * w_, h_ = w_ = 1;  // (c, y, x) order is NCHW's own
      } else if (op == "dense") {
        Dense();
      } else {
        Conv(op[4] - '0', op[5] == 's');
      }
    }
    return x_;
  }

 private:
  void Conv(int k, bool same) {
    const TensorSpec& wt = spec_.tensors[tensor_++];
    const TensorSpec& bt = spec_.tensors[tensor_++];
    const int64_t out = wt.shape[0], pad = same ? (k - 1) / 2 : 0;
    const int64_t oh = h_ + 2 * pad - k + 1, ow = w_ + 2 * pad - k + 1;
    std::vector<double> y(out * oh * ow);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t yy = 0; yy < oh; ++yy) {
        for (int64_t xx = 0; xx < ow; ++xx) {
          double sum = params_[bt.offset + o];
          for (int64_t i = 0; i < c_; ++i) {
            for (int ky = 0; ky < k; ++ky) {
              const int64_t iy = yy + ky - pad;
              if (iy < 0 || iy >= h_) continue;
              for (int kx = 0; kx < k; ++kx) {
                const int64_t ix = xx + kx - pad;
                if (ix < 0 || ix >= w_) continue;
                sum +=
                    double{
                        params_[wt.offset + ((o * c_ + i) * k + ky) * k + kx]} *
                    x_[(i * h_ + iy) * w_ + ix];
              }
            }
          }
          y[(o * oh + yy) * ow + xx] = sum;
        }
      }
    }
    c_ = out, h_ = oh, w_ = ow;
    x_ = std::move(y);
  }

  void Pool() {
    const int64_t oh = h_ / 2, ow = w_ / 2;
    std::vector<double> y(c_ * oh * ow);
    for (int64_t c = 0; c < c_; ++c) {
      for (int64_t yy = 0; yy < oh; ++yy) {
        for (int64_t xx = 0; xx < ow; ++xx) {
          const double* p = &x_[(c * h_ + 2 * yy) * w_ + 2 * xx];
          y[(c * oh + yy) * ow + xx] = std::max({p[0], p[1], p[w_], p[w_ + 1]});
        }
      }
    }
    h_ = oh, w_ = ow;
    x_ = std::move(y);
  }

  void Dense() {
    const TensorSpec& wt = spec_.tensors[tensor_++];
    const TensorSpec& bt = spec_.tensors[tensor_++];
    const int64_t out = wt.shape[0], in = wt.shape[1];
    EXPECT_EQ(in, static_cast<int64_t>(x_.size())) << wt.name;
    std::vector<double> y(out);
    for (int64_t o = 0; o < out; ++o) {
      double sum = params_[bt.offset + o];
      for (int64_t i = 0; i < in; ++i) {
        sum += double{params_[wt.offset + o * in + i]} * x_[i];
      }
      y[o] = sum;
    }
    c_ = out, h_ = w_ = 1;
    x_ = std::move(y);
  }

  const ModelSpec& spec_;
  const float* params_;
  size_t tensor_ = 0;
  int64_t c_ = 1, h_ = 28, w_ = 28;
  std::vector<double> x_;
};

const std::map<std::string, std::vector<std::string>>& ModelOps() {
  static const auto* ops = new std::map<std::string, std::vector<std::string>>{
      {"mnist_cnn",
       {"conv3v", "relu", "conv3v", "relu", "pool", "flatten", "dense", "relu",
        "dense"}},
      {"fedavg_cnn",
       {"conv5s", "relu", "pool", "conv5s", "relu", "pool", "flatten", "dense",
        "relu", "dense"}},
      {"mlp_2nn", {"flatten", "dense", "relu", "dense", "relu", "dense"}}};
  return *ops;
}

TEST(NetworkTest, LogitsMatchAPyTorchStyleReference) {
  const Batch batch = RandomBatch(2, 10);
  for (const auto& [model, ops] : ModelOps()) {
    SCOPED_TRACE(model);
    std::unique_ptr<Network> net = MakeNetwork(model, 4);
    ASSERT_NE(net, nullptr);
    // Biases start at zero; give them values so their layout is checked too.
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
    for (const TensorSpec& t : net->spec().tensors) {
      if (t.init != Init::kZeros) continue;
      for (int64_t i = 0; i < t.num_elements; ++i)
        net->parameters()[t.offset + i] = dist(rng);
    }
    const float* logits = net->Forward(batch.images.data(), batch.size, false);
    ReferenceModel reference(net->spec(), net->parameters().data());
    for (int b = 0; b < batch.size; ++b) {
      const std::vector<double> want =
          reference.Logits(batch.images.data() + b * Network::kImageSize, ops);
      ASSERT_EQ(want.size(), static_cast<size_t>(Network::kClasses));
      for (int k = 0; k < Network::kClasses; ++k) {
        EXPECT_NEAR(logits[b * Network::kClasses + k], want[k],
                    1e-4 * (1 + std::abs(want[k])))
            << "sample " << b << " class " << k;
      }
    }
  }
}

// Central difference of the mean inference-mode loss in parameter `i`, with the
// step actually taken by the rounded floats.
double NumericalDerivative(Network* net, const Batch& batch, int64_t i,
                           float step) {
  float* p = net->parameters().data() + i;
  const float saved = *p;
  *p = saved + step;
  const float up = *p;
  const double l_up =
      net->Evaluate(batch.images.data(), batch.labels.data(), batch.size)
          .loss_sum;
  *p = saved - step;
  const float down = *p;
  const double l_down =
      net->Evaluate(batch.images.data(), batch.labels.data(), batch.size)
          .loss_sum;
  *p = saved;
  return (l_up - l_down) / batch.size / (double{up} - double{down});
}

// Checks ComputeGradients(training=false) against central differences for, per
// parameter tensor, the `top` coordinates with the largest analytic gradient
// and `random` others. Per tensor, ||analytic - numerical|| / ||numerical||
// over those coordinates must be below `tolerance` (`conv_tolerance` for conv
// tensors), and every coordinate within 10% plus 2% of the tensor's largest
// gradient.
//
// Why conv tensors get more room: each conv parameter moves thousands of ReLU
// and max-pool inputs downstream, and at any step float precision allows some
// of them cross their kink, which puts a few percent of noise into the
// numerical derivative (it shrinks towards the analytic value as the step does,
// until rounding takes over). The layers themselves are checked exactly in
// layers_test.cc; what this check is for, a layer wired to the wrong buffer,
// tensor or layout, is off by far more.
void CheckNetworkGradient(const std::string& model, const Batch& batch, int top,
                          int random, double tolerance, double conv_tolerance) {
  std::unique_ptr<Network> net = MakeNetwork(model, 21);
  ASSERT_NE(net, nullptr);
  net->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                        /*training=*/false);
  const std::vector<float> analytic(net->gradients().begin(),
                                    net->gradients().end());

  std::mt19937 rng(5);
  for (const TensorSpec& t : net->spec().tensors) {
    SCOPED_TRACE(t.name);
    std::vector<int64_t> coords(t.num_elements);
    std::iota(coords.begin(), coords.end(), t.offset);
    const int n_top = std::min<int>(top, t.num_elements);
    std::partial_sort(coords.begin(), coords.begin() + n_top, coords.end(),
                      [&](int64_t a, int64_t b) {
                        return std::abs(analytic[a]) > std::abs(analytic[b]);
                      });
    std::shuffle(coords.begin() + n_top, coords.end(), rng);
    coords.resize(std::min<int64_t>(n_top + random, t.num_elements));
    const double largest = std::abs(analytic[coords[0]]);
    ASSERT_GT(largest, 0) << "no gradient reaches " << t.name;

    double diff_sq = 0, norm_sq = 0;
    for (int64_t i : coords) {
      const double a = analytic[i];
      const double n = NumericalDerivative(net.get(), batch, i, 1e-3f);
      diff_sq += (a - n) * (a - n);
      norm_sq += n * n;
      EXPECT_NEAR(a, n,
                  0.1 * std::max(std::abs(a), std::abs(n)) + 0.02 * largest)
          << "parameter " << i << " (" << t.name << "[" << i - t.offset << "])";
    }
    const bool conv = t.name.rfind("conv", 0) == 0;
    EXPECT_LT(std::sqrt(diff_sq / norm_sq), conv ? conv_tolerance : tolerance);
  }
  // Neither ComputeGradients nor the check moved the parameters.
  std::unique_ptr<Network> fresh = MakeNetwork(model, 21);
  EXPECT_EQ(std::memcmp(fresh->parameters().data(), net->parameters().data(),
                        analytic.size() * sizeof(float)),
            0);
}

TEST(NetworkTest, Mlp2nnGradientMatchesFiniteDifferences) {
  CheckNetworkGradient("mlp_2nn", RandomBatch(4, 11), /*top=*/20, /*random=*/60,
                       /*tolerance=*/1e-2, /*conv_tolerance=*/1e-2);
}

TEST(NetworkTest, MnistCnnGradientMatchesFiniteDifferences) {
  CheckNetworkGradient("mnist_cnn", RandomBatch(2, 12), /*top=*/4, /*random=*/4,
                       /*tolerance=*/1e-2, /*conv_tolerance=*/5e-2);
}

TEST(NetworkTest, FedAvgCnnGradientMatchesFiniteDifferences) {
  CheckNetworkGradient("fedavg_cnn", RandomBatch(2, 13), /*top=*/3,
                       /*random=*/3,
                       /*tolerance=*/1e-2, /*conv_tolerance=*/5e-2);
}

// In training mode the dropout masks are part of the function: reseeding both
// dropout layers before every pass makes the loss a fixed function again.
TEST(NetworkTest, MnistCnnTrainingGradientWithFixedMasks) {
  const Batch batch = RandomBatch(2, 14);
  std::unique_ptr<Network> net = MakeNetwork("mnist_cnn", 22);
  ASSERT_NE(net, nullptr);
  std::vector<Dropout*> dropouts;
  for (const auto& layer : net->layers()) {
    if (auto* d = dynamic_cast<Dropout*>(layer.get())) dropouts.push_back(d);
  }
  ASSERT_EQ(dropouts.size(), 2u);
  const auto reseed = [&] {
    for (size_t i = 0; i < dropouts.size(); ++i) dropouts[i]->Reseed(100 + i);
  };
  const auto loss = [&] {
    reseed();
    return net->ComputeGradients(batch.images.data(), batch.labels.data(),
                                 batch.size,
                                 /*training=*/true)
               .loss_sum /
           batch.size;
  };
  loss();
  const std::vector<float> analytic(net->gradients().begin(),
                                    net->gradients().end());
  // The training-mode gradient is not the inference-mode one.
  net->ComputeGradients(batch.images.data(), batch.labels.data(), batch.size,
                        false);
  EXPECT_NE(std::memcmp(analytic.data(), net->gradients().data(),
                        analytic.size() * sizeof(float)),
            0);

  // fc1.weight and fc2.weight: the tensors right after the two dropout layers.
  int checked = 0;
  for (const TensorSpec& t : net->spec().tensors) {
    if (t.name != "fc1.weight" && t.name != "fc2.weight") continue;
    int64_t best = t.offset;
    for (int64_t i = t.offset; i < t.offset + t.num_elements; ++i) {
      if (std::abs(analytic[i]) > std::abs(analytic[best])) best = i;
    }
    float* p = net->parameters().data() + best;
    const float saved = *p;
    *p = saved + 1e-3f;
    const float up = *p;
    const double l_up = loss();
    *p = saved - 1e-3f;
    const float down = *p;
    const double l_down = loss();
    *p = saved;
    const double numerical = (l_up - l_down) / (double{up} - double{down});
    EXPECT_NEAR(analytic[best], numerical, 2e-2 * std::abs(numerical))
        << t.name;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// ~30 steps on a small separable batch drive the loss down clearly.
void ExpectTrainingLearns(const std::string& model,
                          const std::string& optimizer, float lr, int steps) {
  const Batch batch = SeparableBatch(20, 15);
  std::unique_ptr<Network> net = MakeNetwork(model, 23);
  ASSERT_NE(net, nullptr);
  std::unique_ptr<Optimizer> opt =
      MakeOpt(optimizer, lr, net->parameters().size());
  ASSERT_NE(opt, nullptr);
  const LossResult before =
      net->Evaluate(batch.images.data(), batch.labels.data(), 20);
  for (int step = 0; step < steps; ++step) {
    const LossResult r =
        net->TrainStep(batch.images.data(), batch.labels.data(), 20, opt.get());
    ASSERT_TRUE(std::isfinite(r.loss_sum)) << "step " << step;
  }
  const LossResult after =
      net->Evaluate(batch.images.data(), batch.labels.data(), 20);
  EXPECT_LT(after.loss_sum, 0.3 * before.loss_sum)
      << "mean loss " << before.loss_sum / 20 << " -> " << after.loss_sum / 20;
  EXPECT_GE(after.correct, 18);
}

TEST(NetworkTest, Mlp2nnLearnsWithSgd) {
  ExpectTrainingLearns("mlp_2nn", "sgd", 0.1f, 30);
}

TEST(NetworkTest, MnistCnnLearnsWithAdadelta) {
  ExpectTrainingLearns("mnist_cnn", "adadelta", 1.0f, 30);
}

}  // namespace
}  // namespace fedlearn::nn
