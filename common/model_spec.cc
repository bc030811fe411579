#include "common/model_spec.h"

#include <cmath>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

// Conv2D weight [out, in, k, k] with Keras' fans: fan_in = in*k*k, fan_out =
// out*k*k.
TensorDecl ConvWeight(std::string name, int64_t out, int64_t in, int64_t k) {
  return {std::move(name),
          {out, in, k, k},
          Init::kGlorotUniform,
          in * k * k,
          out * k * k};
}
TensorDecl DenseWeight(std::string name, int64_t out, int64_t in) {
  return {std::move(name), {out, in}, Init::kGlorotUniform, in, out};
}
TensorDecl Bias(std::string name, int64_t n) {
  return {std::move(name), {n}, Init::kZeros};
}

std::vector<TensorDecl> MnistCnn() {
  // Conv 32 3x3 valid: 28 -> 26; Conv 64 3x3 valid: 26 -> 24; MaxPool 2: 24
  // -> 12.
  return {ConvWeight("conv1.weight", 32, 1, 3),         Bias("conv1.bias", 32),
          ConvWeight("conv2.weight", 64, 32, 3),        Bias("conv2.bias", 64),
          DenseWeight("fc1.weight", 128, 64 * 12 * 12), Bias("fc1.bias", 128),
          DenseWeight("fc2.weight", 10, 128),           Bias("fc2.bias", 10)};
}

std::vector<TensorDecl> FedAvgCnn() {
  // Two 5x5 'same' convs, each followed by a 2x2 max pool: 28 -> 14 -> 7.
  return {ConvWeight("conv1.weight", 32, 1, 5),       Bias("conv1.bias", 32),
          ConvWeight("conv2.weight", 64, 32, 5),      Bias("conv2.bias", 64),
          DenseWeight("fc1.weight", 512, 64 * 7 * 7), Bias("fc1.bias", 512),
          DenseWeight("fc2.weight", 10, 512),         Bias("fc2.bias", 10)};
}

std::vector<TensorDecl> Mlp2nn() {
  return {DenseWeight("fc1.weight", 200, 784), Bias("fc1.bias", 200),
          DenseWeight("fc2.weight", 200, 200), Bias("fc2.bias", 200),
          DenseWeight("fc3.weight", 10, 200),  Bias("fc3.bias", 10)};
}

}  // namespace

absl::StatusOr<ModelSpec> MakeModelSpec(std::string name,
                                        std::vector<TensorDecl> decls) {
  ModelSpec spec;
  spec.name = std::move(name);
  absl::flat_hash_set<std::string> seen;
  for (TensorDecl& decl : decls) {
    if (decl.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", spec.name, ": tensor with an empty name"));
    }
    if (!seen.insert(decl.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", spec.name, ": duplicate tensor ", decl.name));
    }
    int64_t n = 1;
    for (int64_t d : decl.shape) {
      if (d <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model ", spec.name, ": tensor ", decl.name, " has dimension ", d));
      }
      if (d > kMaxModelParameters / n) {
        return absl::InvalidArgumentError(
            absl::StrCat("model ", spec.name, ": tensor ", decl.name,
                         " has more than 2^36 values"));
      }
      n *= d;
    }
    if (n > kMaxModelParameters - spec.num_parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", spec.name, ": more than 2^36 parameters in all"));
    }
    TensorSpec t;
    t.name = std::move(decl.name);
    t.shape = std::move(decl.shape);
    t.num_elements = n;
    t.offset = spec.num_parameters;
    t.init = decl.init;
    t.fan_in = decl.fan_in;
    t.fan_out = decl.fan_out;
    spec.num_parameters += n;
    spec.tensors.push_back(std::move(t));
  }
  return spec;
}

absl::StatusOr<ModelSpec> LookupModel(absl::string_view name) {
  if (name == "mnist_cnn") return MakeModelSpec("mnist_cnn", MnistCnn());
  if (name == "fedavg_cnn") return MakeModelSpec("fedavg_cnn", FedAvgCnn());
  if (name == "mlp_2nn") return MakeModelSpec("mlp_2nn", Mlp2nn());
  return absl::NotFoundError(absl::StrCat(
      "unknown model \"", name, "\" (known: mnist_cnn, fedavg_cnn, mlp_2nn)"));
}

std::vector<std::string> RegisteredModels() {
  return {"mnist_cnn", "fedavg_cnn", "mlp_2nn"};
}

void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params) {
  // mt19937_64's output sequence is fixed by the standard; the mapping to [0,
  // 1) is ours (std::uniform_real_distribution differs between standard
  // libraries).
  std::mt19937_64 rng(seed);
  for (const TensorSpec& t : spec.tensors) {
    float* out = params.data() + t.offset;
    if (t.init == Init::kZeros) {
      std::fill(out, out + t.num_elements, 0.0f);
      continue;
    }
    const double limit =
        std::sqrt(6.0 / static_cast<double>(t.fan_in + t.fan_out));
    for (int64_t i = 0; i < t.num_elements; ++i) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
      out[i] = static_cast<float>((2.0 * u - 1.0) * limit);
    }
  }
}

}  // namespace fedlearn
