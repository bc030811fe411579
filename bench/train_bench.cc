// Training and inference speed of the registry models (C++/Eigen), in samples
// per second. bench/train-vs-pytorch.sh runs it next to the same model in
// PyTorch.
//
// Args: {batch size, threads}. Inputs are random images in [0, 1] and random
// labels: speed does not depend on the values. Each benchmark runs whole
// optimizer steps (forward, loss, backward, Adadelta) on workspaces allocated
// once, as the client does.

#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "client/nn/network.h"
#include "client/nn/optimizer.h"
#include "client/nn/threads.h"

namespace fedlearn::nn {
namespace {

struct Batch {
  std::vector<float> images;
  std::vector<uint8_t> labels;
};

Batch RandomBatch(int batch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  Batch b;
  b.images.resize(static_cast<size_t>(batch) * Network::kImageSize);
  for (float& p : b.images) p = pixel(rng);
  for (int i = 0; i < batch; ++i)
    b.labels.push_back(static_cast<uint8_t>(rng() % 10));
  return b;
}

void BM_Train(benchmark::State& state, const char* model) {
  const int batch = static_cast<int>(state.range(0));
  SetComputeThreads(static_cast<int>(state.range(1)));
  auto net = *Network::Create(model, 1);
  auto optimizer = *MakeOptimizer("adadelta", 1.0f, net->parameters().size());
  const Batch b = RandomBatch(batch);
  net->Reserve(batch);
  for (int warm = 0; warm < 3; ++warm) {
    net->TrainStep(b.images.data(), b.labels.data(), batch, optimizer.get());
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(net->TrainStep(b.images.data(), b.labels.data(),
                                            batch, optimizer.get()));
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_Inference(benchmark::State& state, const char* model) {
  const int batch = static_cast<int>(state.range(0));
  SetComputeThreads(static_cast<int>(state.range(1)));
  auto net = *Network::Create(model, 1);
  const Batch b = RandomBatch(batch);
  net->Reserve(batch);
  net->Evaluate(b.images.data(), b.labels.data(), batch);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        net->Evaluate(b.images.data(), b.labels.data(), batch));
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "threads"});
  for (int batch : {10, 64}) {
    for (int threads : {1, 2}) b->Args({batch, threads});
  }
  b->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_Train, mnist_cnn, "mnist_cnn")->Apply(Args);
BENCHMARK_CAPTURE(BM_Inference, mnist_cnn, "mnist_cnn")->Apply(Args);

}  // namespace
}  // namespace fedlearn::nn

BENCHMARK_MAIN();
