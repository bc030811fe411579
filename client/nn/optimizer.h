#ifndef FEDLEARN_CLIENT_NN_OPTIMIZER_H_
#define FEDLEARN_CLIENT_NN_OPTIMIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn::nn {

// Updates parameters from their gradients, one step per batch, over the whole
// flat parameter vector at once. Keeps its per-parameter state (accumulators,
// moments) across steps and rounds: optimizer state stays on the client. Not
// thread-safe.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params -= update(grads). Both spans have the size given at creation.
  virtual void Step(absl::Span<float> params,
                    absl::Span<const float> grads) = 0;
  // Changes the learning rate of later steps, keeping the per-parameter state
  // (as a learning-rate schedule does). learning_rate > 0.
  virtual void SetLearningRate(float learning_rate) = 0;
};

// "adadelta" (Keras: rho 0.95, epsilon 1e-7; the seed's, with learning
// rate 1.0), "sgd", "momentum" (0.9, Keras' formulation) or "adam" (beta 0.9 /
// 0.999, epsilon 1e-7, with bias correction). INVALID_ARGUMENT for another name
// or learning_rate <= 0.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(absl::string_view name,
                                                         float learning_rate,
                                                         size_t num_parameters);

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_OPTIMIZER_H_
