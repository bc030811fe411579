// What opening a round costs the run's lock in sampling (README, "Many
// clients"): N clients have joined and are ready (each with a display name, as
// agents give one), and a round samples N/10 of them, as a 1,000-client round
// of 10,000 does: ClientManager::Ready and ::Sample, both under the run
// controller's lock. Reported for N = 1,000, 10,000 and 50,000.
//
//   build/bench/client_manager_bench [--benchmark_filter=...]

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "server/client_manager.h"

namespace fedlearn {
namespace {

const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

void BM_SampleATenthOfTheReady(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  ClientManager::Options options;
  options.max_clients = n;
  ClientManager clients(options);
  for (int i = 0; i < n; ++i) {
    // Names as `fedlearn-client --agents` makes them: host, then a slot.
    if (!clients.Register(absl::StrCat("host-", i % 97, "-p", i), t0).ok()) {
      state.SkipWithError("register failed");
      return;
    }
  }
  for (auto _ : state) {
    std::vector<std::string> sampled =
        clients.Sample(clients.Ready(t0 + absl::Seconds(1)), n / 10);
    benchmark::DoNotOptimize(sampled.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_SampleATenthOfTheReady)
    ->Arg(1000)
    ->Arg(10000)
    ->Arg(50000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fedlearn

BENCHMARK_MAIN();
