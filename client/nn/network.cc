#include "client/nn/network.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/nn/conv2d.h"
#include "client/nn/dense.h"
#include "client/nn/dropout.h"
#include "client/nn/flatten.h"
#include "client/nn/max_pool.h"
#include "client/nn/relu.h"
#include "common/status_macros.h"

namespace fedlearn::nn {
namespace {

std::vector<std::unique_ptr<Layer>> Layers(const std::string& model,
                                           uint64_t seed) {
  std::vector<std::unique_ptr<Layer>> l;
  auto add = [&l](Layer* layer) { l.emplace_back(layer); };
  using P = Conv2D::Padding;
  if (model == "mnist_cnn") {
    add(new Conv2D(32, 3, P::kValid));
    add(new ReLU());
    add(new Conv2D(64, 3, P::kValid));
    add(new ReLU());
    add(new MaxPool2D());
    add(new Dropout(0.25f, seed ^ 0x1111));
    add(new Flatten());
    add(new Dense(128));
    add(new ReLU());
    add(new Dropout(0.5f, seed ^ 0x2222));
    add(new Dense(10));
  } else if (model == "fedavg_cnn") {
    add(new Conv2D(32, 5, P::kSame));
    add(new ReLU());
    add(new MaxPool2D());
    add(new Conv2D(64, 5, P::kSame));
    add(new ReLU());
    add(new MaxPool2D());
    add(new Flatten());
    add(new Dense(512));
    add(new ReLU());
    add(new Dense(10));
  } else if (model == "mlp_2nn") {
    add(new Flatten());
    add(new Dense(200));
    add(new ReLU());
    add(new Dense(200));
    add(new ReLU());
    add(new Dense(10));
  }
  return l;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Network>> Network::Create(
    const std::string& model, uint64_t seed) {
  FEDLEARN_ASSIGN_OR_RETURN(ModelSpec spec, LookupModel(model));
  std::unique_ptr<Network> net(new Network());
  net->spec_ = std::move(spec);
  net->layers_ = Layers(model, seed);
  net->parameters_.resize(net->spec_.num_parameters);
  net->gradients_.resize(net->spec_.num_parameters);
  InitializeParameters(net->spec_, seed, absl::MakeSpan(net->parameters_));

  Shape shape{1, 28, 28, /*spatial=*/true};
  net->shapes_.push_back(shape);
  size_t tensor = 0;
  for (auto& layer : net->layers_) {
    shape = layer->Init(shape);
    net->shapes_.push_back(shape);
    for (int i = 0; i < layer->num_parameter_tensors(); ++i, ++tensor) {
      if (tensor >= net->spec_.tensors.size() ||
          net->spec_.tensors[tensor].num_elements != layer->parameter_size(i)) {
        return absl::InternalError(
            absl::StrCat("model ", model, ": layer ", layer->name(),
                         " does not match the registry's tensor ", tensor));
      }
      const int64_t offset = net->spec_.tensors[tensor].offset;
      layer->Bind(i, net->parameters_.data() + offset,
                  net->gradients_.data() + offset);
    }
  }
  if (tensor != net->spec_.tensors.size() || shape.size() != kClasses) {
    return absl::InternalError(
        absl::StrCat("model ", model, ": layers and registry differ"));
  }
  return net;
}

void Network::Reserve(int max_batch) {
  if (max_batch <= reserved_) return;
  reserved_ = max_batch;
  activations_.resize(layers_.size());
  deltas_.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Reserve(max_batch);
    activations_[i].resize(static_cast<size_t>(max_batch) *
                           shapes_[i + 1].size());
    deltas_[i].resize(activations_[i].size());
  }
}

const float* Network::Forward(const float* images, int batch, bool training) {
  Reserve(batch);
  const float* in = images;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(in, activations_[i].data(), batch, training);
    in = activations_[i].data();
  }
  return in;
}

LossResult Network::ComputeGradients(const float* images, const uint8_t* labels,
                                     int batch, bool training) {
  const float* logits = Forward(images, batch, training);
  LossResult result = SoftmaxCrossEntropy(logits, labels, kClasses, batch,
                                          deltas_.back().data());
  // Every parameter belongs to exactly one layer, which overwrites its
  // gradient.
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* in = i == 0 ? images : activations_[i - 1].data();
    float* din = i == 0 ? nullptr : deltas_[i - 1].data();
    layers_[i]->Backward(in, activations_[i].data(), deltas_[i].data(), din,
                         batch);
  }
  return result;
}

LossResult Network::TrainStep(const float* images, const uint8_t* labels,
                              int batch, Optimizer* optimizer,
                              const Proximal& proximal) {
  LossResult result =
      ComputeGradients(images, labels, batch, /*training=*/true);
  if (proximal.mu > 0) {
    const float mu = proximal.mu;
    const float* __restrict w = parameters_.data();
    const float* __restrict anchor = proximal.anchor;
    float* __restrict g = gradients_.data();
    const size_t n = gradients_.size();
    for (size_t i = 0; i < n; ++i) g[i] += mu * (w[i] - anchor[i]);
  }
  optimizer->Step(absl::MakeSpan(parameters_), gradients_);
  return result;
}

LossResult Network::Evaluate(const float* images, const uint8_t* labels,
                             int batch) {
  const float* logits = Forward(images, batch, /*training=*/false);
  return SoftmaxCrossEntropy(logits, labels, kClasses, batch, nullptr);
}

}  // namespace fedlearn::nn
