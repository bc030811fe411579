#include "common/model_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t num_elements;
  int64_t offset;
  Init init;
  int64_t fan_in;
  int64_t fan_out;
};

void ExpectTensors(const ModelSpec& spec,
                   const std::vector<ExpectedTensor>& want) {
  ASSERT_EQ(spec.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_THAT(t.shape, ElementsAreArray(want[i].shape));
    EXPECT_EQ(t.num_elements, want[i].num_elements);
    EXPECT_EQ(t.offset, want[i].offset);
    EXPECT_EQ(t.init, want[i].init);
    if (want[i].init == Init::kGlorotUniform) {
      EXPECT_EQ(t.fan_in, want[i].fan_in);
      EXPECT_EQ(t.fan_out, want[i].fan_out);
    }
  }
}

// Every tensor starts where the previous one ended, and the sizes add up.
void ExpectContiguous(const ModelSpec& spec) {
  int64_t next = 0;
  for (const TensorSpec& t : spec.tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    EXPECT_EQ(t.num_elements, n) << t.name;
    EXPECT_EQ(t.offset, next) << t.name;
    next += t.num_elements;
  }
  EXPECT_EQ(spec.num_parameters, next);
}

ModelSpec Lookup(const std::string& name) {
  absl::StatusOr<ModelSpec> spec = LookupModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

TEST(ModelSpecTest, MnistCnnLayout) {
  const ModelSpec spec = Lookup("mnist_cnn");
  EXPECT_EQ(spec.name, "mnist_cnn");
  EXPECT_EQ(spec.num_parameters, 1199882);
  // 28x28 -> conv 3x3 -> 26 -> conv 3x3 -> 24 -> pool 2 -> 12; 64 * 12 * 12 =
  // 9216.
  ExpectTensors(
      spec,
      {
          {"conv1.weight", {32, 1, 3, 3}, 288, 0, Init::kGlorotUniform, 9, 288},
          {"conv1.bias", {32}, 32, 288, Init::kZeros, 0, 0},
          {"conv2.weight",
           {64, 32, 3, 3},
           18432,
           320,
           Init::kGlorotUniform,
           288,
           576},
          {"conv2.bias", {64}, 64, 18752, Init::kZeros, 0, 0},
          {"fc1.weight",
           {128, 9216},
           1179648,
           18816,
           Init::kGlorotUniform,
           9216,
           128},
          {"fc1.bias", {128}, 128, 1198464, Init::kZeros, 0, 0},
          {"fc2.weight",
           {10, 128},
           1280,
           1198592,
           Init::kGlorotUniform,
           128,
           10},
          {"fc2.bias", {10}, 10, 1199872, Init::kZeros, 0, 0},
      });
  ExpectContiguous(spec);
}

TEST(ModelSpecTest, FedAvgCnnLayout) {
  const ModelSpec spec = Lookup("fedavg_cnn");
  EXPECT_EQ(spec.name, "fedavg_cnn");
  EXPECT_EQ(spec.num_parameters, 1663370);
  // 28x28 -> conv 5x5 same -> pool 2 -> 14 -> conv 5x5 same -> pool 2 -> 7.
  ExpectTensors(spec, {
                          {"conv1.weight",
                           {32, 1, 5, 5},
                           800,
                           0,
                           Init::kGlorotUniform,
                           25,
                           800},
                          {"conv1.bias", {32}, 32, 800, Init::kZeros, 0, 0},
                          {"conv2.weight",
                           {64, 32, 5, 5},
                           51200,
                           832,
                           Init::kGlorotUniform,
                           800,
                           1600},
                          {"conv2.bias", {64}, 64, 52032, Init::kZeros, 0, 0},
                          {"fc1.weight",
                           {512, 3136},
                           1605632,
                           52096,
                           Init::kGlorotUniform,
                           3136,
                           512},
                          {"fc1.bias", {512}, 512, 1657728, Init::kZeros, 0, 0},
                          {"fc2.weight",
                           {10, 512},
                           5120,
                           1658240,
                           Init::kGlorotUniform,
                           512,
                           10},
                          {"fc2.bias", {10}, 10, 1663360, Init::kZeros, 0, 0},
                      });
  ExpectContiguous(spec);
}

TEST(ModelSpecTest, Mlp2nnLayout) {
  const ModelSpec spec = Lookup("mlp_2nn");
  EXPECT_EQ(spec.name, "mlp_2nn");
  EXPECT_EQ(spec.num_parameters, 199210);
  ExpectTensors(
      spec,
      {
          {"fc1.weight", {200, 784}, 156800, 0, Init::kGlorotUniform, 784, 200},
          {"fc1.bias", {200}, 200, 156800, Init::kZeros, 0, 0},
          {"fc2.weight",
           {200, 200},
           40000,
           157000,
           Init::kGlorotUniform,
           200,
           200},
          {"fc2.bias", {200}, 200, 197000, Init::kZeros, 0, 0},
          {"fc3.weight",
           {10, 200},
           2000,
           197200,
           Init::kGlorotUniform,
           200,
           10},
          {"fc3.bias", {10}, 10, 199200, Init::kZeros, 0, 0},
      });
  ExpectContiguous(spec);
}

TEST(ModelSpecTest, EveryRegisteredModelLooksUp) {
  EXPECT_THAT(RegisteredModels(),
              ElementsAre("mnist_cnn", "fedavg_cnn", "mlp_2nn"));
  for (const std::string& name : RegisteredModels()) {
    absl::StatusOr<ModelSpec> spec = LookupModel(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->name, name);
    ExpectContiguous(*spec);
  }
}

TEST(ModelSpecTest, UnknownModelIsNotFound) {
  for (const char* name : {"resnet50", "", "MNIST_CNN", "mnist_cnn "}) {
    absl::StatusOr<ModelSpec> spec = LookupModel(name);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound)
        << "\"" << name << "\"";
  }
  EXPECT_THAT(LookupModel("resnet50").status().message(),
              HasSubstr("resnet50"));
}

TEST(MakeModelSpecTest, ComputesSizesAndOffsets) {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("tiny", {{"w", {3, 5}, Init::kGlorotUniform, 5, 3},
                             {"b", {3}, Init::kZeros},
                             {"s", {}, Init::kZeros},  // a scalar: one element
                             {"t", {2, 1, 2}, Init::kZeros}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "tiny");
  EXPECT_EQ(spec->num_parameters, 15 + 3 + 1 + 4);
  ExpectTensors(*spec, {
                           {"w", {3, 5}, 15, 0, Init::kGlorotUniform, 5, 3},
                           {"b", {3}, 3, 15, Init::kZeros, 0, 0},
                           {"s", {}, 1, 18, Init::kZeros, 0, 0},
                           {"t", {2, 1, 2}, 4, 19, Init::kZeros, 0, 0},
                       });
}

TEST(MakeModelSpecTest, EmptyModelHasNoParameters) {
  absl::StatusOr<ModelSpec> spec = MakeModelSpec("empty", {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->tensors.empty());
  EXPECT_EQ(spec->num_parameters, 0);
}

TEST(MakeModelSpecTest, DuplicateNameIsInvalid) {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("m", {{"w", {2, 2}, Init::kZeros},
                          {"b", {2}, Init::kZeros},
                          {"w", {4}, Init::kZeros}});
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("duplicate"));
  EXPECT_THAT(spec.status().message(), HasSubstr("w"));
}

TEST(MakeModelSpecTest, EmptyNameIsInvalid) {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("m", {{"", {2}, Init::kZeros}});
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeModelSpecTest, ZeroDimensionIsInvalid) {
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(
      "m", {{"ok", {2}, Init::kZeros}, {"flat", {4, 0, 3}, Init::kZeros}});
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("flat"));
}

// A shape read from a file or the wire: its product must not wrap (this one
// is 2^64 + 4, which an unchecked int64 product turns into 4).
TEST(MakeModelSpecTest, SizesThatWouldOverflowAreInvalid) {
  absl::StatusOr<ModelSpec> wraps = MakeModelSpec(
      "m", {{"huge", {4, 5, 5581, 8681, 49477, 384773}, Init::kZeros}});
  EXPECT_EQ(wraps.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wraps.status().message(),
              HasSubstr("tensor huge has more than 2^36 values"));
  const int64_t half = (int64_t{1} << 35) + 1;
  absl::StatusOr<ModelSpec> sum = MakeModelSpec(
      "m", {{"a", {half}, Init::kZeros}, {"b", {half}, Init::kZeros}});
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sum.status().message(), HasSubstr("more than 2^36 parameters"));
  // The bound itself is a valid (if large) spec: nothing is allocated.
  absl::StatusOr<ModelSpec> largest = MakeModelSpec(
      "m", {{"a", {int64_t{1} << 18, int64_t{1} << 18}, Init::kZeros}});
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(largest->num_parameters, kMaxModelParameters);
}

TEST(MakeModelSpecTest, NegativeDimensionIsInvalid) {
  absl::StatusOr<ModelSpec> spec =
      MakeModelSpec("m", {{"neg", {-1, 3}, Init::kZeros}});
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("neg"));
}

// Parameters of `spec` initialised with `seed`, over a buffer pre-filled with a
// value no initialiser produces, so that a tensor left unwritten shows.
std::vector<float> Initialized(const ModelSpec& spec, uint64_t seed) {
  std::vector<float> params(spec.num_parameters, 7.0f);
  InitializeParameters(spec, seed, absl::MakeSpan(params));
  return params;
}

TEST(InitializeParametersTest, SameSeedGivesTheSameBits) {
  const ModelSpec spec = Lookup("mnist_cnn");
  const std::vector<float> a = Initialized(spec, 42);
  const std::vector<float> b = Initialized(spec, 42);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(InitializeParametersTest, DifferentSeedGivesDifferentKernels) {
  const ModelSpec spec = Lookup("mnist_cnn");
  const std::vector<float> a = Initialized(spec, 42);
  const std::vector<float> b = Initialized(spec, 43);
  for (const TensorSpec& t : spec.tensors) {
    if (t.init != Init::kGlorotUniform) continue;
    int64_t same = 0;
    for (int64_t i = t.offset; i < t.offset + t.num_elements; ++i) {
      same += a[i] == b[i];
    }
    // Two independent draws coincide essentially never.
    EXPECT_LE(same, t.num_elements / 1000) << t.name;
  }
}

// The generator is mt19937_64 (fixed by the standard) mapped to [0, 1) by its
// top 53 bits, so the values are the same on every machine. The first three of
// conv1.weight for seed 42, limit sqrt(6 / (9 + 288)), computed independently.
TEST(InitializeParametersTest, ValuesArePinnedAcrossMachines) {
  const ModelSpec spec = Lookup("mnist_cnn");
  const std::vector<float> params = Initialized(spec, 42);
  EXPECT_EQ(params[0], 0x1.2917ccp-4f);  // 0.07253246
  EXPECT_EQ(params[1], 0x1.43c3e6p-5f);  // 0.03952212
  EXPECT_EQ(params[2], 0x1.25967cp-4f);  // 0.07167672
}

TEST(InitializeParametersTest, BiasesAreZero) {
  for (const std::string& name : RegisteredModels()) {
    const ModelSpec spec = Lookup(name);
    const std::vector<float> params = Initialized(spec, 1);
    for (const TensorSpec& t : spec.tensors) {
      if (t.init != Init::kZeros) continue;
      for (int64_t i = t.offset; i < t.offset + t.num_elements; ++i) {
        ASSERT_EQ(params[i], 0.0f) << name << " " << t.name << " [" << i << "]";
        ASSERT_FALSE(std::signbit(params[i])) << name << " " << t.name;
      }
    }
  }
}

TEST(InitializeParametersTest, KernelsAreGlorotUniform) {
  for (const std::string& name : RegisteredModels()) {
    const ModelSpec spec = Lookup(name);
    const std::vector<float> params = Initialized(spec, 2024);
    for (const TensorSpec& t : spec.tensors) {
      if (t.init != Init::kGlorotUniform) continue;
      SCOPED_TRACE(name + " " + t.name);
      const double limit =
          std::sqrt(6.0 / static_cast<double>(t.fan_in + t.fan_out));
      double sum = 0;
      double sum_sq = 0;
      for (int64_t i = t.offset; i < t.offset + t.num_elements; ++i) {
        const float v = params[i];
        ASSERT_TRUE(std::isfinite(v));
        ASSERT_LE(std::fabs(v), static_cast<float>(limit)) << "[" << i << "]";
        sum += v;
        sum_sq += static_cast<double>(v) * v;
      }
      const double n = static_cast<double>(t.num_elements);
      const double mean = sum / n;
      const double variance = sum_sq / n - mean * mean;
      // U(-l, l) has mean 0 and variance l^2 / 3. The sample mean's standard
      // error is l / sqrt(3n) and the sample variance's about 0.3 l^2 /
      // sqrt(n); allow 5 to 6 of them (the smallest kernel has 288 elements).
      EXPECT_LE(std::fabs(mean), 6.0 * limit / std::sqrt(3.0 * n));
      EXPECT_NEAR(variance, limit * limit / 3.0,
                  5.0 * 0.3 * limit * limit / std::sqrt(n));
      // And the values spread over the whole range, not a corner of it.
      if (t.num_elements >= 1000) {
        double lo = limit;
        double hi = -limit;
        for (int64_t i = t.offset; i < t.offset + t.num_elements; ++i) {
          lo = std::min<double>(lo, params[i]);
          hi = std::max<double>(hi, params[i]);
        }
        EXPECT_LT(lo, -0.99 * limit);
        EXPECT_GT(hi, 0.99 * limit);
      }
    }
  }
}

}  // namespace
}  // namespace fedlearn
