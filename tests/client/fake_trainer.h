// A trainer of tests: what it trains and reports is scripted, so that what a
// coordinator makes of it can be checked exactly (agent_test.cc,
// agent_faults_test.cc).
#ifndef FEDLEARN_TESTS_CLIENT_FAKE_TRAINER_H_
#define FEDLEARN_TESTS_CLIENT_FAKE_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "client/agent.h"
#include "client/trainer.h"
#include "gtest/gtest.h"

namespace fedlearn::testing {

// What a FakeTrainer does: adds `add` to every weight and reports fixed
// metrics.
struct Script {
  float add = 0.01f;
  int64_t num_examples = 100;
  double loss = 1.0;
  double accuracy = 0.5;
  double validation_loss = 0.9;
  double validation_accuracy = 0.6;
  int64_t num_validation = 10;
  EvalMetrics eval = {50, 0.2, 0.8};
  // Called at the start of each Train with the 0-based call number.
  std::function<void(int call, const ProgressFn& progress)> on_train;
};

class FakeTrainer : public Trainer {
 public:
  explicit FakeTrainer(Script script) : script_(std::move(script)) {}

  absl::StatusOr<TrainMetrics> Train(absl::Span<float> weights,
                                     const v1::TrainingPlan& plan,
                                     bool run_validation,
                                     const ProgressFn& progress) override {
    EXPECT_EQ(plan.batch_size(), 10);
    if (script_.on_train) script_.on_train(calls_, progress);
    ++calls_;
    for (float& w : weights) w += script_.add;
    progress(1, 1);
    TrainMetrics m;
    m.num_examples = script_.num_examples;
    m.loss = script_.loss;
    m.accuracy = script_.accuracy;
    if (run_validation) {
      m.num_validation = script_.num_validation;
      m.validation_loss = script_.validation_loss;
      m.validation_accuracy = script_.validation_accuracy;
    }
    return m;
  }

  absl::StatusOr<EvalMetrics> Evaluate(absl::Span<const float>) override {
    return script_.eval;
  }

 private:
  const Script script_;
  int calls_ = 0;
};

// A factory of FakeTrainers that counts the trainers it built.
inline TrainerFactory FakeFactory(
    Script script, std::shared_ptr<std::atomic<int>> built = nullptr) {
  return [script = std::move(script), built](const v1::JoinResponse& joined)
             -> absl::StatusOr<std::unique_ptr<Trainer>> {
    EXPECT_EQ(joined.model().name(), "mlp_2nn");
    if (built != nullptr) ++*built;
    return std::make_unique<FakeTrainer>(script);
  };
}

}  // namespace fedlearn::testing

#endif  // FEDLEARN_TESTS_CLIENT_FAKE_TRAINER_H_
