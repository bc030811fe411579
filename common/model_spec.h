#ifndef FEDLEARN_COMMON_MODEL_SPEC_H_
#define FEDLEARN_COMMON_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace fedlearn {

// How a parameter tensor starts out.
enum class Init {
  kZeros,          // biases
  kGlorotUniform,  // Keras' default kernel initializer: U(-l, l), l =
                   // sqrt(6/(fan_in+fan_out))
};

// One named parameter tensor of a model and where it lives in the flat
// parameter vector.
struct TensorSpec {
  std::string name;  // e.g. "conv1.weight"
  std::vector<int64_t>
      shape;  // PyTorch layouts: conv [out, in, kh, kw], dense [out, in]
  int64_t num_elements = 0;  // product of shape
  int64_t offset = 0;        // first element in the flat vector
  Init init = Init::kZeros;
  int64_t fan_in = 0;  // for kGlorotUniform
  int64_t fan_out = 0;
};

// A model's parameters as a list of tensors laid end to end in one flat float
// vector, in the order they travel on the wire. Immutable once built; cheap to
// share.
struct ModelSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t num_parameters = 0;
};

// The most parameters a model may have: 2^36 (256 GiB of float32), beyond
// any machine this runs on, and small enough that every size and byte offset
// derived from a spec (values * 4, sums of tensors) fits in an int64. A spec
// read from a file or the wire cannot make those computations overflow.
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 36;

// Builds a spec from (name, shape, init) triples, computing sizes and offsets.
// Fails with INVALID_ARGUMENT on an empty or duplicate name, a non-positive
// dimension or more than kMaxModelParameters values.
struct TensorDecl {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
absl::StatusOr<ModelSpec> MakeModelSpec(std::string name,
                                        std::vector<TensorDecl> decls);

// The model registry. Names: "mnist_cnn" (the seed's CNN, 1,199,882
// parameters), "fedavg_cnn" (the FedAvg paper's CNN, 1,663,370) and "mlp_2nn"
// (784-200-200-10, 199,210). NOT_FOUND for any other name.
absl::StatusOr<ModelSpec> LookupModel(absl::string_view name);
std::vector<std::string> RegisteredModels();

// Fills `params` (spec.num_parameters floats) with the spec's initialisation,
// drawn from a generator seeded with `seed`. Deterministic across machines and
// standard libraries.
void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_MODEL_SPEC_H_
