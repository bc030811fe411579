#ifndef FEDLEARN_CLIENT_TRAINER_H_
#define FEDLEARN_CLIENT_TRAINER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>

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

// Where one round of local training stands, after a batch. The epoch fields
// are 0 when the trainer does not tell them (a trainer that reports only
// batches: see ProgressFn).
struct TrainProgress {
  int64_t done = 0;   // batches done in the round
  int64_t total = 0;  // batches in the round
  int epoch = 0;      // the current local epoch, 1-based
  int epochs = 0;     // local epochs in the round
  int64_t epoch_batches_done = 0;
  int64_t epoch_batches = 0;
  int64_t epoch_examples_done = 0;  // training examples seen this epoch
  double loss = 0;                  // mean training loss over this epoch so far
  double accuracy = 0;  // mean training accuracy over this epoch so far

  bool has_epochs() const { return epochs > 0 && epoch_batches > 0; }
};

// Called during training after each batch (for heartbeats and progress
// displays). May be called often; keep it cheap.
//
// Either form works on both sides, so older trainers and callers need no
// change: a trainer calls progress(done, total) or
// progress(TrainProgress{...}); a caller passes a callable taking (int64_t
// done, int64_t total) or (const TrainProgress&). The two-number call leaves
// the epoch fields 0.
class ProgressFn {
 public:
  ProgressFn() = default;
  ProgressFn(std::nullptr_t) {}  // NOLINT: as std::function
  template <
      typename F,
      std::enable_if_t<std::is_invocable_v<F&, const TrainProgress&>, int> = 0>
  ProgressFn(F f) : fn_(std::move(f)) {}  // NOLINT: as std::function
  template <typename F,
            std::enable_if_t<std::is_invocable_v<F&, int64_t, int64_t> &&
                                 !std::is_invocable_v<F&, const TrainProgress&>,
                             int> = 1>
  ProgressFn(F f)  // NOLINT: as std::function
      : fn_([f = std::move(f)](const TrainProgress& p) mutable {
          f(p.done, p.total);
        }) {}

  void operator()(const TrainProgress& progress) const {
    if (fn_) fn_(progress);
  }
  void operator()(int64_t done, int64_t total) const {
    TrainProgress progress;
    progress.done = done;
    progress.total = total;
    (*this)(progress);
  }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  std::function<void(const TrainProgress&)> fn_;
};

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
