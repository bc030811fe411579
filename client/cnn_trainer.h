#ifndef FEDLEARN_CLIENT_CNN_TRAINER_H_
#define FEDLEARN_CLIENT_CNN_TRAINER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/idx.h"
#include "client/trainer.h"

namespace fedlearn {

struct CnnTrainerOptions {
  std::string model = "mnist_cnn";  // registry name (common/model_spec.h)
  Dataset train;      // local training data; validation is held out of it
  Dataset test;       // local test split, for EVALUATE
  uint64_t seed = 1;  // shuffling, dropout and the validation split
  int threads = 1;    // compute threads this trainer may use
  // Input scaling, for training and evaluation alike: a pixel byte p becomes
  // (p / 255 - input_mean) / input_std. The defaults give [0, 1].
  float input_mean = 0.0f;
  float input_std = 1.0f;
};

// Sets `options`' input scaling to the run's plan (TrainingPlan.input_mean and
// input_std; input_std 0 keeps p / 255): every client of a run, and whatever
// judges its model, must scale inputs alike.
void SetInputNorm(const v1::TrainingPlan& plan, CnnTrainerOptions* options);

// The Trainer of the registry's models (mnist_cnn, fedavg_cnn, mlp_2nn), in C++
// with Eigen. NOT_FOUND for an unknown model; INVALID_ARGUMENT for images that
// are not 28x28 or empty data.
absl::StatusOr<std::unique_ptr<Trainer>> MakeCnnTrainer(
    CnnTrainerOptions options);

// Whether this agent can train `served`, the model a coordinator serves: it
// must be a registry architecture with exactly the registry's tensors.
// FAILED_PRECONDITION otherwise, with a message that says what differs and
// that other clients (the Python SDK) train any model.
absl::Status CheckTrainable(const v1::ModelSpec& served);

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_CNN_TRAINER_H_
