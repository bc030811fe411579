// central_train: trains a registry model centrally (one "client" holding the
// whole training set) with the client's own CnnTrainer, and evaluates it on the
// test set after every epoch. bench/accuracy.sh runs it next to the same model
// in PyTorch (bench/peers/train_pytorch.py --mode=accuracy).
//
// Prints one JSON line per epoch on stdout:
//   {"side":"fedlearn","epoch":1,"train_loss":...,"train_accuracy":...,
//    "test_loss":...,"test_accuracy":...,"epoch_seconds":...,"wall_seconds":...}
// With --init_out it also writes the initial weights (the registry's seeded
// Glorot-uniform initialisation, as the coordinator makes them) as raw
// little-endian float32 in the wire order, which is PyTorch's state_dict order
// and layout, so the PyTorch peer can start from the same weights.
// --input_norm and --lr_decay (both also in the peer) try other recipes than
// the seed's: standardised inputs and a per-epoch learning-rate decay.

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cnn_trainer.h"
#include "client/idx.h"
#include "common/flags.h"
#include "common/model_spec.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, data_dir, "data/mnist",
          "IDX directory (train-*/t10k-* files, raw or .gz)");
ABSL_FLAG(std::string, model, "mnist_cnn", "registry model");
ABSL_FLAG(int, epochs, 5, "epochs; the test set is evaluated after each");
ABSL_FLAG(int, batch_size, 10, "mini-batch size");
ABSL_FLAG(std::string, optimizer, "adadelta", "adadelta, sgd, momentum, adam");
ABSL_FLAG(double, learning_rate, 1.0, "learning rate (Adadelta: 1.0)");
ABSL_FLAG(
    double, lr_decay, 1.0,
    "learning rate multiplier after every epoch (PyTorch's StepLR gamma)");
ABSL_FLAG(std::string, input_norm, "none",
          "input scaling, for training and testing: none (pixel / 255, the "
          "seed's), train (standardised with the train split's pixel mean "
          "and std) or MEAN,STD ((pixel / 255 - MEAN) / STD)");
ABSL_FLAG(int, threads, 1, "compute threads");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the initial weights, the shuffling and dropout");
ABSL_FLAG(std::string, init_out, "",
          "if set, write the initial weights here (raw float32, wire order)");

namespace fedlearn {
namespace {

absl::Status WriteFloats(const std::string& path,
                         const std::vector<float>& values) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr)
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const size_t written =
      std::fwrite(values.data(), sizeof(float), values.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != values.size() || !closed) {
    return absl::DataLossError(absl::StrCat("short write to ", path));
  }
  return absl::OkStatus();
}

// --input_norm as the mean and std the trainer standardises with.
absl::StatusOr<PixelStats> ParseInputNorm(absl::string_view flag,
                                          const Dataset& train) {
  if (flag == "none") return PixelStats{0.0f, 1.0f};
  if (flag == "train") return ComputePixelStats(train);
  const std::vector<absl::string_view> parts = absl::StrSplit(flag, ',');
  PixelStats stats;
  if (parts.size() != 2 || !absl::SimpleAtof(parts[0], &stats.mean) ||
      !absl::SimpleAtof(parts[1], &stats.std) || !(stats.std > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--input_norm=", flag, ": want none, train or MEAN,STD with STD > 0"));
  }
  return stats;
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  CnnTrainerOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  FEDLEARN_ASSIGN_OR_RETURN(options.train, LoadMnistDir(dir, /*train=*/true));
  FEDLEARN_ASSIGN_OR_RETURN(options.test, LoadMnistDir(dir, /*train=*/false));
  options.seed = absl::GetFlag(FLAGS_seed);
  options.threads = absl::GetFlag(FLAGS_threads);
  FEDLEARN_ASSIGN_OR_RETURN(
      const PixelStats norm,
      ParseInputNorm(absl::GetFlag(FLAGS_input_norm), options.train));
  options.input_mean = norm.mean;
  options.input_std = norm.std;
  const float input_mean = norm.mean, input_std = norm.std;
  const int64_t train_size = options.train.size();
  const int64_t test_size = options.test.size();

  FEDLEARN_ASSIGN_OR_RETURN(ModelSpec spec, LookupModel(options.model));
  std::vector<float> weights(static_cast<size_t>(spec.num_parameters));
  InitializeParameters(spec, options.seed, absl::MakeSpan(weights));
  if (const std::string out = absl::GetFlag(FLAGS_init_out); !out.empty()) {
    FEDLEARN_RETURN_IF_ERROR(WriteFloats(out, weights));
  }
  FEDLEARN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                            MakeCnnTrainer(std::move(options)));

  // One epoch per Train call: the trainer keeps its optimizer state and its
  // shuffling generator across calls, so this is the same as one 5-epoch call
  // with an evaluation between epochs.
  v1::TrainingPlan plan;
  plan.set_epochs(1);
  plan.set_batch_size(absl::GetFlag(FLAGS_batch_size));
  plan.set_optimizer(absl::GetFlag(FLAGS_optimizer));
  plan.set_learning_rate(
      static_cast<float>(absl::GetFlag(FLAGS_learning_rate)));
  plan.set_validation_fraction(0);

  std::printf(
      "{\"side\":\"fedlearn\",\"event\":\"start\",\"data_dir\":\"%s\","
      "\"train_examples\":%lld,\"test_examples\":%lld,\"parameters\":%lld,"
      "\"threads\":%d,\"batch_size\":%d,\"input_mean\":%.4f,"
      "\"input_std\":%.4f,\"lr_decay\":%g}\n",
      dir.c_str(), static_cast<long long>(train_size),
      static_cast<long long>(test_size),
      static_cast<long long>(spec.num_parameters), absl::GetFlag(FLAGS_threads),
      plan.batch_size(), input_mean, input_std, absl::GetFlag(FLAGS_lr_decay));
  std::fflush(stdout);
  const absl::Time start = absl::Now();
  {
    // Epoch 0: the initial weights. Equal to the PyTorch peer's when it starts
    // from --init_out's file, which checks that both compute the same model.
    FEDLEARN_ASSIGN_OR_RETURN(EvalMetrics test, trainer->Evaluate(weights));
    std::printf(
        "{\"side\":\"fedlearn\",\"epoch\":0,\"test_loss\":%.4f,"
        "\"test_accuracy\":%.4f}\n",
        test.loss, test.accuracy);
    std::fflush(stdout);
  }
  for (int epoch = 1; epoch <= absl::GetFlag(FLAGS_epochs); ++epoch) {
    const absl::Time epoch_start = absl::Now();
    FEDLEARN_ASSIGN_OR_RETURN(
        TrainMetrics train, trainer->Train(absl::MakeSpan(weights), plan,
                                           /*run_validation=*/false, nullptr));
    FEDLEARN_ASSIGN_OR_RETURN(EvalMetrics test, trainer->Evaluate(weights));
    const absl::Time now = absl::Now();
    std::printf(
        "{\"side\":\"fedlearn\",\"epoch\":%d,\"train_loss\":%.4f,"
        "\"train_accuracy\":%.4f,\"test_loss\":%.4f,\"test_accuracy\":%.4f,"
        "\"epoch_seconds\":%.2f,\"wall_seconds\":%.2f}\n",
        epoch, train.loss, train.accuracy, test.loss, test.accuracy,
        absl::ToDoubleSeconds(now - epoch_start),
        absl::ToDoubleSeconds(now - start));
    std::fflush(stdout);
    plan.set_learning_rate(plan.learning_rate() *
                           static_cast<float>(absl::GetFlag(FLAGS_lr_decay)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(argc, argv,
                       "central_train: trains a registry model on a whole IDX "
                       "directory, evaluating after every epoch");
  const absl::Status status = fedlearn::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "central_train: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
