#ifndef FEDLEARN_CLIENT_NN_NETWORK_H_
#define FEDLEARN_CLIENT_NN_NETWORK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/nn/layer.h"
#include "client/nn/optimizer.h"
#include "client/nn/softmax_cross_entropy.h"
#include "common/model_spec.h"

namespace fedlearn::nn {

// A registry model (common/model_spec.h) as a sequential network of layers over
// 28x28x1 images, with softmax cross-entropy. Parameters and gradients live in
// two flat vectors in the spec's wire order; layers work on views into them, so
// weights move between the wire and training without conversion. Workspaces are
// allocated once per batch size (Reserve) and reused. Not thread-safe; Eigen's
// own threads are set process-wide.
// FedProx's proximal term (Li et al. 2020): mu * (w - anchor) added to every
// gradient, anchor being the weights the round started from (as many floats as
// the network's parameters). mu 0: none.
struct Proximal {
  const float* anchor = nullptr;
  float mu = 0;
};

class Network {
 public:
  // NOT_FOUND for an unknown model. `seed` initialises the parameters (as the
  // coordinator does) and the dropout masks.
  static absl::StatusOr<std::unique_ptr<Network>> Create(
      const std::string& model, uint64_t seed);

  const ModelSpec& spec() const { return spec_; }
  absl::Span<float> parameters() { return absl::MakeSpan(parameters_); }
  absl::Span<const float> gradients() const { return gradients_; }

  static constexpr int kImageSize = 28 * 28;
  static constexpr int kClasses = 10;

  // Sizes workspaces for batches of up to `max_batch` (grows, never shrinks).
  void Reserve(int max_batch);

  // Forward pass on `batch` images (batch x 784 floats in [0, 1], image after
  // image); returns the logits, kClasses x batch, valid until the next call.
  const float* Forward(const float* images, int batch, bool training);

  // One training step: forward, loss, backward (gradients are the batch mean),
  // plus `proximal`'s term when its mu > 0, then `optimizer` updates the
  // parameters. With mu 0 the step is plain training, bit for bit.
  LossResult TrainStep(const float* images, const uint8_t* labels, int batch,
                       Optimizer* optimizer, const Proximal& proximal = {});

  // Forward in inference mode and the loss, without touching gradients.
  LossResult Evaluate(const float* images, const uint8_t* labels, int batch);

  // Gradients of the mean loss over the batch for the current parameters,
  // without an update (for gradient checks). `training` selects dropout.
  LossResult ComputeGradients(const float* images, const uint8_t* labels,
                              int batch, bool training);

  // The layers, for tests and for reseeding dropout.
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

 private:
  Network() = default;

  ModelSpec spec_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape>
      shapes_;  // shapes_[i]: input of layer i; shapes_.back(): logits
  std::vector<float> parameters_;
  std::vector<float> gradients_;
  int reserved_ = 0;
  std::vector<std::vector<float>> activations_;  // [i]: output of layer i
  std::vector<std::vector<float>> deltas_;       // [i]: dL/d(output of layer i)
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_NETWORK_H_
