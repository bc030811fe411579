#ifndef FEDLEARN_SERVER_STRATEGY_SERVER_OPTIMIZER_H_
#define FEDLEARN_SERVER_STRATEGY_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn {

// An optimizer's state between steps, as the state directory saves it: the
// number of steps taken and named model-sized vectors ("momentum", "m", "v").
// The vectors are immutable snapshots: saving one never copies or blocks a
// step.
struct OptimizerState {
  int64_t steps = 0;
  std::vector<std::pair<std::string, std::shared_ptr<const std::vector<float>>>>
      slots;
};

// Moves the global model along the aggregate update Delta of a step
// (Aggregator::Finish), Reddi et al. 2021, "Adaptive Federated Optimization",
// Algorithm 2. Arithmetic is in double per coordinate; state is stored in
// float32 (4 bytes per parameter and slot). Not thread-safe: the run
// controller serialises every call under its lock.
class ServerOptimizer {
 public:
  virtual ~ServerOptimizer() = default;

  // Writes the next global model into every element of `next` (whatever it
  // held before: the run controller reuses buffers) from `current` and
  // `delta` (all num_parameters long; `next` must not alias `current`).
  virtual void Step(absl::Span<const double> delta,
                    absl::Span<const float> current,
                    absl::Span<float> next) = 0;

  // The state after the last step, and its restoration on resume.
  // INVALID_ARGUMENT when `state` does not have this optimizer's slots, each
  // num_parameters long.
  virtual OptimizerState State() const = 0;
  virtual absl::Status Restore(const OptimizerState& state) = 0;
};

// Server SGD with optional momentum (FedAvgM, Hsu et al. 2019):
//   v = momentum * v + Delta;  x = x + lr * v.
// With momentum 0 there is no state and x = x + lr * Delta: FedAvg at lr 1,
// bit for bit the seed's float(x + Delta).
class SgdServerOptimizer final : public ServerOptimizer {
 public:
  SgdServerOptimizer(size_t num_parameters, double learning_rate,
                     double momentum);

  void Step(absl::Span<const double> delta, absl::Span<const float> current,
            absl::Span<float> next) override;
  OptimizerState State() const override;
  absl::Status Restore(const OptimizerState& state) override;

 private:
  const size_t num_parameters_;
  const double learning_rate_;
  const double momentum_;
  int64_t steps_ = 0;
  std::shared_ptr<std::vector<float>> velocity_;  // null when momentum is 0
};

// The adaptive server optimizers of Reddi et al. 2021, Algorithm 2:
//   m = beta_1 * m + (1 - beta_1) * Delta
//   v = v + Delta^2                                        (FedAdagrad)
//   v = beta_2 * v + (1 - beta_2) * Delta^2                (FedAdam)
//   v = v - (1 - beta_2) * Delta^2 * sign(v - Delta^2)     (FedYogi)
//   x = x + lr_t * m / (sqrt(v) + tau)
// with m starting at 0 and v at tau^2 (the paper's v_{-1} >= tau^2), and
// lr_t = lr, as in the paper. With bias_correction (Flower's FedAdam), lr_t =
// lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) at step t = 1, 2, ...
class AdaptiveServerOptimizer final : public ServerOptimizer {
 public:
  enum class Rule { kAdagrad, kAdam, kYogi };
  struct Params {
    Rule rule = Rule::kAdam;
    double learning_rate = 0.01;
    double beta_1 = 0.9;
    double beta_2 = 0.99;
    double tau = 1e-3;
    bool bias_correction = false;
  };

  AdaptiveServerOptimizer(size_t num_parameters, Params params);

  void Step(absl::Span<const double> delta, absl::Span<const float> current,
            absl::Span<float> next) override;
  OptimizerState State() const override;
  absl::Status Restore(const OptimizerState& state) override;

 private:
  const size_t num_parameters_;
  const Params params_;
  int64_t steps_ = 0;
  std::shared_ptr<std::vector<float>> m_;
  std::shared_ptr<std::vector<float>> v_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_SERVER_OPTIMIZER_H_
