#include "client/cnn_trainer.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "client/nn/network.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

// 40 noisy 28x28 images whose label is where a bright block sits.
Dataset BlockImages(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 40);
  Dataset data;
  data.rows = data.cols = 28;
  for (int i = 0; i < 40; ++i) {
    const int label = i % 10;
    data.labels.push_back(static_cast<uint8_t>(label));
    for (int p = 0; p < 28 * 28; ++p) {
      const int r = p / 28, c = p % 28;
      const bool ink = r / 14 == label / 5 && c / 5 == label % 5 && c < 25;
      data.pixels.push_back(static_cast<uint8_t>(ink ? 255 : noise(rng)));
    }
  }
  return data;
}

std::unique_ptr<Trainer> MakeTrainer() {
  CnnTrainerOptions options;
  options.model = "mlp_2nn";
  options.train = BlockImages(1);
  options.test = BlockImages(2);
  options.seed = 9;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      MakeCnnTrainer(std::move(options));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return trainer.ok() ? *std::move(trainer) : nullptr;
}

v1::TrainingPlan Plan(const std::string& optimizer, bool reset) {
  v1::TrainingPlan plan;
  plan.set_epochs(1);
  plan.set_batch_size(10);
  plan.set_optimizer(optimizer);
  plan.set_learning_rate(optimizer == "sgd" ? 0.05f : 1.0f);
  plan.set_validation_fraction(0);
  plan.set_reset_optimizer(reset);
  return plan;
}

// One round from `start` with `plan`; the trained weights.
std::vector<float> Round(Trainer& trainer, const std::vector<float>& start,
                         const v1::TrainingPlan& plan) {
  std::vector<float> weights = start;
  absl::StatusOr<TrainMetrics> metrics = trainer.Train(
      absl::MakeSpan(weights), plan, /*run_validation=*/false, nullptr);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return weights;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// TrainingPlan.reset_optimizer: a client that keeps its Adadelta state trains
// its second round differently from one that starts it afresh, and starting
// afresh is exactly a trainer whose Adadelta was never used. All three
// trainers draw the same shuffles (the seed's) and start round 2 from the
// same weights, so the optimizer state is the only difference.
TEST(CnnTrainerTest, ResetOptimizerStartsTheRoundWithAFreshState) {
  absl::StatusOr<std::unique_ptr<nn::Network>> net =
      nn::Network::Create("mlp_2nn", 3);
  ASSERT_TRUE(net.ok()) << net.status();
  const std::vector<float> start((*net)->parameters().begin(),
                                 (*net)->parameters().end());
  std::unique_ptr<Trainer> keeps = MakeTrainer(), resets = MakeTrainer(),
                           fresh = MakeTrainer();
  ASSERT_TRUE(keeps && resets && fresh);

  const std::vector<float> first =
      Round(*keeps, start, Plan("adadelta", false));
  EXPECT_TRUE(SameBits(Round(*resets, start, Plan("adadelta", false)), first));
  // The third trainer's first round uses SGD: it draws the same shuffles but
  // leaves no Adadelta state behind.
  EXPECT_FALSE(SameBits(Round(*fresh, start, Plan("sgd", false)), first));

  const std::vector<float> kept = Round(*keeps, first, Plan("adadelta", false));
  const std::vector<float> reset =
      Round(*resets, first, Plan("adadelta", true));
  const std::vector<float> never =
      Round(*fresh, first, Plan("adadelta", false));
  EXPECT_TRUE(SameBits(reset, never));
  EXPECT_FALSE(SameBits(reset, kept));
}

// A plan the trainer refuses changes nothing: the round after it trains
// exactly as it would have without the refused one (its optimizer state, its
// validation split and its data order untouched).
TEST(CnnTrainerTest, ARefusedPlanLeavesTheTrainerAsItWas) {
  absl::StatusOr<std::unique_ptr<nn::Network>> net =
      nn::Network::Create("mlp_2nn", 3);
  ASSERT_TRUE(net.ok()) << net.status();
  const std::vector<float> start((*net)->parameters().begin(),
                                 (*net)->parameters().end());
  std::unique_ptr<Trainer> clean = MakeTrainer(), refused = MakeTrainer();
  ASSERT_TRUE(clean && refused);
  const std::vector<float> first =
      Round(*clean, start, Plan("adadelta", false));
  ASSERT_TRUE(SameBits(Round(*refused, start, Plan("adadelta", false)), first));

  std::vector<v1::TrainingPlan> bad(5, Plan("adadelta", /*reset=*/true));
  bad[0].set_proximal_mu(-1);
  bad[1].set_validation_fraction(std::numeric_limits<float>::quiet_NaN());
  bad[2].set_validation_fraction(1.0f);  // 0.99999999 as a float
  bad[3].set_validation_fraction(-1.0f);
  bad[4].set_validation_fraction(0.5f);
  bad[4].set_proximal_mu(std::numeric_limits<float>::infinity());
  for (const v1::TrainingPlan& plan : bad) {
    std::vector<float> weights = first;
    absl::StatusOr<TrainMetrics> metrics = refused->Train(
        absl::MakeSpan(weights), plan, /*run_validation=*/false, nullptr);
    EXPECT_EQ(metrics.status().code(), absl::StatusCode::kInvalidArgument)
        << plan.ShortDebugString();
  }
  EXPECT_TRUE(SameBits(Round(*refused, first, Plan("adadelta", false)),
                       Round(*clean, first, Plan("adadelta", false))));
}

}  // namespace
}  // namespace fedlearn
