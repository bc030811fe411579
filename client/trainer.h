#ifndef FEDLEARN_CLIENT_TRAINER_H_
#define FEDLEARN_CLIENT_TRAINER_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

// What one round of local training produced, for the update's header.
struct TrainMetrics {
  int64_t num_examples =
      0;                // training examples seen (the update's FedAvg weight)
  double loss = 0;      // mean training loss over the round
  double accuracy = 0;  // mean training accuracy over the round
  int64_t num_validation = 0;  // 0 when validation did not run
  double validation_loss = 0;
  double validation_accuracy = 0;
};

// An evaluation on the local test split.
struct EvalMetrics {
  int64_t num_examples = 0;
  double loss = 0;
  double accuracy = 0;
};

// Called during training with batches done and batches in the round (for
// heartbeats and progress displays). May be called often; keep it cheap.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// A client's local learner: trains the model it was built for on its own data
// and evaluates it. The agent owns one per joined client and calls it from one
// thread.
class Trainer {
 public:
  virtual ~Trainer() = default;

  // Trains for one round as `plan` says, starting from `weights` (the round's
  // global weights, num_parameters floats) and leaving the locally trained
  // weights in it. Validates on the held-out split when `run_validation`.
  // INVALID_ARGUMENT for a plan it cannot follow (unknown optimizer, batch size
  // < 1).
  virtual absl::StatusOr<TrainMetrics> Train(absl::Span<float> weights,
                                             const v1::TrainingPlan& plan,
                                             bool run_validation,
                                             const ProgressFn& progress) = 0;

  // Evaluates `weights` on the local test split.
  virtual absl::StatusOr<EvalMetrics> Evaluate(
      absl::Span<const float> weights) = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_TRAINER_H_
