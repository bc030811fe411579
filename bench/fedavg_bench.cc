// FedAvg fold throughput next to a plain streaming read of the same bytes, and
// the close of a round: the mean and server step, and central DP's noise.
//
// Both walk the same set of update buffers (8 updates of the seed CNN, 38 MB);
// throughput is reported in bytes of update data per second. Where the L3 is
// smaller than that (32 MB on the AMD machines), the updates stream from
// memory; where it is larger (`lscpu` reports 260 MiB on some Intel guests),
// both loops run from cache and the read is several times faster, so the
// ratio depends on the machine (README, "Receiving updates"). The fold also
// reads and writes its double accumulator (9.6 MB), so it moves 5x the
// update's bytes.

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "common/aligned_vector.h"
#include "common/crc32c.h"
#include "common/model_spec.h"
#include "server/privacy/secure_gaussian.h"
#include "server/strategy/aggregator.h"
#include "server/strategy/server_optimizer.h"
#include "server/strategy/update_transform.h"

namespace fedlearn {
namespace {

constexpr int kUpdates = 8;

// Held as the coordinator holds a received update: in a staging buffer, on a
// cache line.
using Update = AlignedVector<float>;

const std::vector<Update>& Updates() {
  static const auto* updates = [] {
    const int64_t n = LookupModel("mnist_cnn")->num_parameters;
    auto* u = new std::vector<Update>(kUpdates, Update(n));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-0.01f, 0.01f);
    for (auto& update : *u) {
      for (float& v : update) v = dist(rng);
    }
    return u;
  }();
  return *updates;
}

// Runs `pass` on each update in turn, one per iteration, and reports bytes of
// update data per second.
template <typename Pass>
void OverUpdates(benchmark::State& state, Pass pass) {
  const auto& updates = Updates();
  size_t next = 0;
  for (auto _ : state) pass(updates[next++ % kUpdates]);
  state.SetBytesProcessed(state.iterations() * updates[0].size() *
                          sizeof(float));
}

void BM_StreamingRead(benchmark::State& state) {
  OverUpdates(state, [](const Update& u) {
    // An integer sum of the words: it vectorises (a float sum would not,
    // without -ffast-math), so this loop runs at the memory's read bandwidth.
    const auto* words = reinterpret_cast<const uint32_t*>(u.data());
    uint32_t sum = 0;
    for (size_t i = 0; i < u.size(); ++i) sum += words[i];
    benchmark::DoNotOptimize(sum);
  });
}
BENCHMARK(BM_StreamingRead)->Unit(benchmark::kMicrosecond);

void BM_FedAvgFold(benchmark::State& state) {
  WeightedMeanAggregator accumulator(Updates()[0].size());
  OverUpdates(state, [&accumulator](const Update& u) {
    accumulator.Fold(100.0, 1.0, u);
    benchmark::ClobberMemory();
  });
}
BENCHMARK(BM_FedAvgFold)->Unit(benchmark::kMicrosecond);

// What the coordinator does to every received byte besides the fold: the
// CRC-32C of each chunk (the tensor's is combined from the chunks', with no
// pass of its own), and the sum of squares that is both the finiteness check
// and the update's norm (BM_L2Norm is that pass and its root).
void BM_Crc32c(benchmark::State& state) {
  OverUpdates(state, [](const Update& u) {
    benchmark::DoNotOptimize(Crc32c(u.data(), u.size() * sizeof(float)));
  });
}
BENCHMARK(BM_Crc32c)->Unit(benchmark::kMicrosecond);

void BM_L2Norm(benchmark::State& state) {
  OverUpdates(state,
              [](const Update& u) { benchmark::DoNotOptimize(L2Norm(u)); });
}
BENCHMARK(BM_L2Norm)->Unit(benchmark::kMicrosecond);

// The close of a FedAvg round: the mean, and server SGD at rate 1 writing the
// next model.
void BM_ApplyMean(benchmark::State& state) {
  const auto& updates = Updates();
  WeightedMeanAggregator accumulator(updates[0].size());
  accumulator.Fold(1.0, 1.0, updates[0]);
  SgdServerOptimizer sgd(updates[0].size(), 1.0, 0.0);
  std::vector<float> global(updates[0].size(), 0.5f), out(global.size());
  for (auto _ : state) {
    sgd.Step(*accumulator.Finish(), global, absl::MakeSpan(out));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * global.size() * sizeof(float));
}
BENCHMARK(BM_ApplyMean)->Unit(benchmark::kMicrosecond);

// Central DP's extra work at a close: N(0, s^2) from the secure generator on
// every coordinate of the sum (mnist_cnn: 1.2M doubles), to set beside
// BM_ApplyMean, the step it precedes under the same lock.
void BM_SecureNoise(benchmark::State& state) {
  std::vector<double> sum(Updates()[0].size(), 0.0);
  for (auto _ : state) {
    if (!AddSecureGaussianNoise(1.0, absl::MakeSpan(sum)).ok()) {
      state.SkipWithError("the secure generator failed");
      break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * sum.size() * sizeof(float));
}
BENCHMARK(BM_SecureNoise)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace fedlearn

BENCHMARK_MAIN();
