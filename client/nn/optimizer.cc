#include "client/nn/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fedlearn::nn {
namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  void Step(absl::Span<float> params, absl::Span<const float> grads) override {
    float* __restrict w = params.data();
    const float* __restrict g = grads.data();
    for (size_t i = 0; i < params.size(); ++i) w[i] -= lr_ * g[i];
  }

  void SetLearningRate(float lr) override { lr_ = lr; }

 private:
  float lr_;
};

// v = momentum * v - lr * g; w += v.
class Momentum final : public Optimizer {
 public:
  Momentum(float lr, size_t n) : lr_(lr), velocity_(n, 0.0f) {}
  void Step(absl::Span<float> params, absl::Span<const float> grads) override {
    float* __restrict v = velocity_.data();
    float* __restrict w = params.data();
    const float* __restrict g = grads.data();
    for (size_t i = 0; i < params.size(); ++i) {
      v[i] = kMomentum * v[i] - lr_ * g[i];
      w[i] += v[i];
    }
  }

  void SetLearningRate(float lr) override { lr_ = lr; }

 private:
  static constexpr float kMomentum = 0.9f;
  float lr_;
  std::vector<float> velocity_;
};

// Zeiler's Adadelta as Keras implements it:
//   a = rho a + (1-rho) g^2;  d = g sqrt(b + eps) / sqrt(a + eps);
//   b = rho b + (1-rho) d^2;  w -= lr d.
class Adadelta final : public Optimizer {
 public:
  Adadelta(float lr, size_t n)
      : lr_(lr), grad_sq_(n, 0.0f), delta_sq_(n, 0.0f) {}
  void Step(absl::Span<float> params, absl::Span<const float> grads) override {
    // Restrict-qualified: the four arrays never overlap, and saying so lets the
    // compiler vectorise the loop (otherwise it runs one element at a time).
    float* __restrict a = grad_sq_.data();
    float* __restrict b = delta_sq_.data();
    float* __restrict w = params.data();
    const float* __restrict grad = grads.data();
    for (size_t i = 0; i < params.size(); ++i) {
      const float g = grad[i];
      a[i] = kRho * a[i] + (1 - kRho) * g * g;
      const float d = g * std::sqrt((b[i] + kEpsilon) / (a[i] + kEpsilon));
      b[i] = kRho * b[i] + (1 - kRho) * d * d;
      w[i] -= lr_ * d;
    }
  }

  void SetLearningRate(float lr) override { lr_ = lr; }

 private:
  static constexpr float kRho = 0.95f;
  static constexpr float kEpsilon = 1e-7f;
  float lr_;
  std::vector<float> grad_sq_, delta_sq_;
};

class Adam final : public Optimizer {
 public:
  Adam(float lr, size_t n) : lr_(lr), m_(n, 0.0f), v_(n, 0.0f) {}
  void Step(absl::Span<float> params, absl::Span<const float> grads) override {
    ++t_;
    const double c1 = 1 - std::pow(kBeta1, t_), c2 = 1 - std::pow(kBeta2, t_);
    const float step = static_cast<float>(lr_ * std::sqrt(c2) / c1);
    float* __restrict m = m_.data();
    float* __restrict v = v_.data();
    float* __restrict w = params.data();
    const float* __restrict grad = grads.data();
    for (size_t i = 0; i < params.size(); ++i) {
      const float g = grad[i];
      m[i] = kBeta1 * m[i] + (1 - kBeta1) * g;
      v[i] = kBeta2 * v[i] + (1 - kBeta2) * g * g;
      w[i] -= step * m[i] / (std::sqrt(v[i]) + kEpsilon);
    }
  }

  void SetLearningRate(float lr) override { lr_ = lr; }

 private:
  static constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEpsilon = 1e-7f;
  float lr_;
  int64_t t_ = 0;
  std::vector<float> m_, v_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
    absl::string_view name, float learning_rate, size_t num_parameters) {
  if (!(learning_rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, ": learning rate ", learning_rate, " must be > 0"));
  }
  if (name == "sgd") return std::make_unique<Sgd>(learning_rate);
  if (name == "momentum")
    return std::make_unique<Momentum>(learning_rate, num_parameters);
  if (name == "adadelta")
    return std::make_unique<Adadelta>(learning_rate, num_parameters);
  if (name == "adam")
    return std::make_unique<Adam>(learning_rate, num_parameters);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer \"", name,
                   "\" (known: adadelta, sgd, momentum, adam)"));
}

}  // namespace fedlearn::nn
