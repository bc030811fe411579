#include "client/cnn_trainer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/nn/network.h"
#include "client/nn/optimizer.h"
#include "client/nn/threads.h"
#include "common/model_spec.h"
#include "common/status_macros.h"

namespace fedlearn {
namespace {

// Evaluation batch: large enough for efficient GEMMs, small enough that the
// conv workspaces (which grow with the batch) stay in the tens of megabytes.
constexpr int kEvalBatch = 50;

// Trains one registry network on one client's data. Keeps the optimizer's state
// across rounds (as a Keras client that compiles once and calls fit every
// round), and its workspaces, so steady-state rounds allocate nothing.
class CnnTrainer final : public Trainer {
 public:
  CnnTrainer(std::unique_ptr<nn::Network> net, CnnTrainerOptions options)
      : net_(std::move(net)),
        train_(std::move(options.train)),
        test_(std::move(options.test)),
        rng_(options.seed),
        input_scale_(1.0f / (255.0f * options.input_std)),
        input_shift_(-options.input_mean / options.input_std),
        threads_(std::max(1, options.threads)) {}

  absl::StatusOr<TrainMetrics> Train(absl::Span<float> weights,
                                     const v1::TrainingPlan& plan,
                                     bool run_validation,
                                     const ProgressFn& progress) override {
    if (weights.size() != net_->parameters().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights have ", weights.size(), " values, model ",
                       net_->spec().name, " has ", net_->parameters().size()));
    }
    // Every field checked before anything changes: a refused plan leaves the
    // optimizer, the validation split and the weights as they were.
    if (plan.batch_size() < 1 || plan.epochs() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: batch size ", plan.batch_size(), " and epochs ",
                       plan.epochs(), " must be at least 1"));
    }
    if (!(plan.proximal_mu() >= 0) || !std::isfinite(plan.proximal_mu())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: proximal_mu ", plan.proximal_mu(), " must be >= 0"));
    }
    // The coordinator's double below 1 can round to 1.0f; NaN fails both.
    if (!(plan.validation_fraction() >= 0 && plan.validation_fraction() < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: validation_fraction ", plan.validation_fraction(),
                       " must be in [0, 1)"));
    }
    FEDLEARN_RETURN_IF_ERROR(PrepareOptimizer(plan));
    SplitValidation(plan.validation_fraction());
    nn::SetComputeThreads(threads_);
    std::copy(weights.begin(), weights.end(), net_->parameters().begin());

    // FedProx pulls towards the weights the round started from: `weights`
    // holds them untouched until training ends.
    const nn::Proximal proximal{weights.data(), plan.proximal_mu()};
    const int batch = plan.batch_size();
    const int64_t n = static_cast<int64_t>(train_index_.size());
    const int64_t batches_per_epoch = (n + batch - 1) / batch;
    const int64_t total = batches_per_epoch * plan.epochs();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    TrainProgress at;
    at.total = total;
    at.epochs = plan.epochs();
    at.epoch_batches = batches_per_epoch;
    for (int epoch = 0; epoch < plan.epochs(); ++epoch) {
      Shuffle(&train_index_);
      double epoch_loss = 0;
      int64_t epoch_correct = 0;
      at.epoch = epoch + 1;
      at.epoch_batches_done = 0;
      at.epoch_examples_done = 0;
      for (int64_t start = 0; start < n; start += batch) {
        const int size = static_cast<int>(std::min<int64_t>(batch, n - start));
        LoadBatch(train_, train_index_.data() + start, size);
        const nn::LossResult r = net_->TrainStep(
            images_.data(), labels_.data(), size, optimizer_.get(), proximal);
        loss_sum += r.loss_sum;
        correct += r.correct;
        seen += size;
        if (progress) {
          epoch_loss += r.loss_sum;
          epoch_correct += r.correct;
          ++at.done;
          ++at.epoch_batches_done;
          at.epoch_examples_done += size;
          at.loss = epoch_loss / at.epoch_examples_done;
          at.accuracy =
              static_cast<double>(epoch_correct) / at.epoch_examples_done;
          progress(at);
        }
      }
    }
    std::copy(net_->parameters().begin(), net_->parameters().end(),
              weights.begin());

    TrainMetrics metrics;
    metrics.num_examples = n;
    metrics.loss = seen > 0 ? loss_sum / seen : 0;
    metrics.accuracy = seen > 0 ? static_cast<double>(correct) / seen : 0;
    if (run_validation && !validation_index_.empty()) {
      const EvalMetrics v = EvaluateOn(train_, validation_index_);
      metrics.num_validation = v.num_examples;
      metrics.validation_loss = v.loss;
      metrics.validation_accuracy = v.accuracy;
    }
    return metrics;
  }

  absl::StatusOr<EvalMetrics> Evaluate(
      absl::Span<const float> weights) override {
    if (weights.size() != net_->parameters().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights have ", weights.size(), " values, model has ",
                       net_->parameters().size()));
    }
    nn::SetComputeThreads(threads_);
    std::copy(weights.begin(), weights.end(), net_->parameters().begin());
    std::vector<int64_t> all(static_cast<size_t>(test_.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    return EvaluateOn(test_, all);
  }

 private:
  // A new optimizer when the plan names another one or asks for a fresh state
  // every round; a new learning rate alone keeps the optimizer's state (as a
  // learning-rate schedule does).
  absl::Status PrepareOptimizer(const v1::TrainingPlan& plan) {
    if (optimizer_ != nullptr && plan.optimizer() == optimizer_name_ &&
        !plan.reset_optimizer()) {
      if (!(plan.learning_rate() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan: learning rate ", plan.learning_rate(), " must be > 0"));
      }
      optimizer_->SetLearningRate(plan.learning_rate());
      return absl::OkStatus();
    }
    FEDLEARN_ASSIGN_OR_RETURN(
        optimizer_, nn::MakeOptimizer(plan.optimizer(), plan.learning_rate(),
                                      net_->parameters().size()));
    optimizer_name_ = plan.optimizer();
    return absl::OkStatus();
  }

  // Holds out the same validation examples every round (drawn once per
  // fraction).
  void SplitValidation(float fraction) {
    if (fraction == split_fraction_) return;
    split_fraction_ = fraction;
    std::vector<int64_t> all(static_cast<size_t>(train_.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    Shuffle(&all);
    const size_t held =
        std::min(all.size() - std::min<size_t>(all.size(), 1),
                 static_cast<size_t>(std::floor(fraction * all.size())));
    validation_index_.assign(all.begin(), all.begin() + held);
    train_index_.assign(all.begin() + held, all.end());
    std::sort(validation_index_.begin(), validation_index_.end());
  }

  // Fisher-Yates with our own bounded draw: the same order on every standard
  // library.
  void Shuffle(std::vector<int64_t>* v) {
    for (size_t i = v->size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(rng_() % i);
      std::swap((*v)[i - 1], (*v)[j]);
    }
  }

  void LoadBatch(const Dataset& data, const int64_t* index, int size) {
    const int64_t pixels = data.pixels_per_image();
    images_.resize(static_cast<size_t>(size) * pixels);
    labels_.resize(size);
    const float scale = input_scale_, shift = input_shift_;
    for (int b = 0; b < size; ++b) {
      const uint8_t* src = data.image(index[b]);
      float* dst = images_.data() + b * pixels;
      for (int64_t p = 0; p < pixels; ++p) dst[p] = src[p] * scale + shift;
      labels_[b] = data.labels[index[b]];
    }
  }

  EvalMetrics EvaluateOn(const Dataset& data,
                         const std::vector<int64_t>& index) {
    double loss_sum = 0;
    int64_t correct = 0;
    const int64_t n = static_cast<int64_t>(index.size());
    for (int64_t start = 0; start < n; start += kEvalBatch) {
      const int size =
          static_cast<int>(std::min<int64_t>(kEvalBatch, n - start));
      LoadBatch(data, index.data() + start, size);
      const nn::LossResult r =
          net_->Evaluate(images_.data(), labels_.data(), size);
      loss_sum += r.loss_sum;
      correct += r.correct;
    }
    EvalMetrics metrics;
    metrics.num_examples = n;
    metrics.loss = n > 0 ? loss_sum / n : 0;
    metrics.accuracy = n > 0 ? static_cast<double>(correct) / n : 0;
    return metrics;
  }

  std::unique_ptr<nn::Network> net_;
  Dataset train_;
  Dataset test_;
  std::mt19937_64 rng_;
  const float input_scale_;  // pixel byte -> input: p * scale + shift
  const float input_shift_;
  const int threads_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  std::string optimizer_name_;
  float split_fraction_ = -1;
  std::vector<int64_t> train_index_;
  std::vector<int64_t> validation_index_;
  std::vector<float> images_;
  std::vector<uint8_t> labels_;
};

}  // namespace

void SetInputNorm(const v1::TrainingPlan& plan, CnnTrainerOptions* options) {
  if (plan.input_std() > 0) {
    options->input_mean = plan.input_mean();
    options->input_std = plan.input_std();
  } else {
    options->input_mean = 0.0f;
    options->input_std = 1.0f;
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> MakeCnnTrainer(
    CnnTrainerOptions options) {
  for (const Dataset* d : {&options.train, &options.test}) {
    if (d->size() > 0 && (d->rows != 28 || d->cols != 28)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "images are ", d->rows, "x", d->cols, "; the models take 28x28"));
    }
  }
  if (options.train.size() == 0)
    return absl::InvalidArgumentError("no training data");
  if (!(options.input_std > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_std ", options.input_std, " must be > 0"));
  }
  FEDLEARN_ASSIGN_OR_RETURN(std::unique_ptr<nn::Network> net,
                            nn::Network::Create(options.model, options.seed));
  return std::make_unique<CnnTrainer>(std::move(net), std::move(options));
}

absl::Status CheckTrainable(const v1::ModelSpec& served) {
  const auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the coordinator serves model \"", served.name(), "\" (",
        served.tensors_size(), " tensors, ", served.num_parameters(),
        " parameters), which fedlearn-client cannot train: ", why,
        ". It trains the registry architectures ",
        absl::StrJoin(RegisteredModels(), ", "),
        "; train other models with the Python SDK or your own client"));
  };
  absl::StatusOr<ModelSpec> known = LookupModel(served.name());
  if (!known.ok()) return refuse("not a registry architecture");
  if (served.tensors_size() != static_cast<int>(known->tensors.size())) {
    return refuse(absl::StrCat(served.name(), " has ", known->tensors.size(),
                               " tensors"));
  }
  for (int i = 0; i < served.tensors_size(); ++i) {
    const v1::TensorSpec& got = served.tensors(i);
    const TensorSpec& want = known->tensors[i];
    const std::vector<int64_t> shape(got.shape().begin(), got.shape().end());
    if (got.name() != want.name || shape != want.shape) {
      return refuse(absl::StrCat("its tensor ", i, " is ", got.name(), " [",
                                 absl::StrJoin(shape, ", "), "], ",
                                 served.name(), "'s is ", want.name, " [",
                                 absl::StrJoin(want.shape, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace fedlearn
