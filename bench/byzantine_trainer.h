#ifndef FEDLEARN_BENCH_BYZANTINE_TRAINER_H_
#define FEDLEARN_BENCH_BYZANTINE_TRAINER_H_

// A Byzantine client for the attack benchmark (bench/attacks.sh): it trains
// honestly, then replaces its update delta = trained - global with an attack,
// so that the coordinator receives a well-formed update that lies.
//   signflip  -10 delta: the honest direction reversed and scaled up;
//   noise     Gaussian noise with as large a norm as delta (each coordinate
//             N(0, |delta| / sqrt(P))), carrying no signal;
//   constant  +1 in every coordinate: a large update in one fixed direction.
// Benchmark code only: the product's agent never alters its update.

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/trainer.h"

namespace fedlearn {

enum class Attack { kSignFlip, kNoise, kConstant };

inline absl::StatusOr<Attack> ParseAttack(const std::string& name) {
  if (name == "signflip") return Attack::kSignFlip;
  if (name == "noise") return Attack::kNoise;
  if (name == "constant") return Attack::kConstant;
  return absl::InvalidArgumentError(absl::StrCat(
      "--attack=", name, ": expected signflip, noise or constant"));
}

class ByzantineTrainer final : public Trainer {
 public:
  ByzantineTrainer(std::unique_ptr<Trainer> honest, Attack attack,
                   uint64_t seed)
      : honest_(std::move(honest)), attack_(attack), rng_(seed) {}

  absl::StatusOr<TrainMetrics> Train(absl::Span<float> weights,
                                     const v1::TrainingPlan& plan,
                                     bool run_validation,
                                     const ProgressFn& progress) override {
    global_.assign(weights.begin(), weights.end());
    absl::StatusOr<TrainMetrics> metrics =
        honest_->Train(weights, plan, run_validation, progress);
    if (!metrics.ok()) return metrics;
    double norm_sq = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      const double d = double{weights[i]} - global_[i];
      norm_sq += d * d;
    }
    const double sigma =
        std::sqrt(norm_sq / static_cast<double>(weights.size()));
    std::normal_distribution<double> normal(0.0, sigma);
    for (size_t i = 0; i < weights.size(); ++i) {
      const double delta = double{weights[i]} - global_[i];
      double lie = 0;
      switch (attack_) {
        case Attack::kSignFlip:
          lie = -10 * delta;
          break;
        case Attack::kNoise:
          lie = normal(rng_);
          break;
        case Attack::kConstant:
          lie = 1.0;
          break;
      }
      weights[i] = static_cast<float>(global_[i] + lie);
    }
    return metrics;
  }

  absl::StatusOr<EvalMetrics> Evaluate(
      absl::Span<const float> weights) override {
    return honest_->Evaluate(weights);
  }

 private:
  std::unique_ptr<Trainer> honest_;
  Attack attack_;
  std::mt19937_64 rng_;
  std::vector<float> global_;  // the round's weights, to form delta
};

}  // namespace fedlearn

#endif  // FEDLEARN_BENCH_BYZANTINE_TRAINER_H_
