// What a state save costs as a run grows (--state_dir; README, "Crash-safe
// state"): a run of mlp_2nn whose history already holds N records of
// 100-client rounds (selected and accepted ids, as a real round records them)
// closes one more round and saves, as the coordinator does after every
// aggregation: the new model, and the state with its history. Reports the time
// per save and the bytes written per save (`written_per_save`), for N = 100,
// 1,000 and 10,000. A save whose cost grows with N makes a long run's rounds
// slower and its disk busier the longer it runs.
//
//   build/bench/state_bench [--benchmark_filter=...]
//
// The state directory is under $TMPDIR (/tmp): its disk and its fsync are part
// of the figure, so compare sizes within one run, not across machines.

#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/process_stats.h"
#include "benchmark/benchmark.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/history.h"
#include "server/state_store.h"

namespace fedlearn {
namespace {

// A closed round of 100 clients, all accepted, with ids as the coordinator
// makes them (16 hex digits).
v1::RoundRecord Round(int64_t round) {
  v1::RoundRecord record;
  record.set_round(round);
  record.set_attempt(1);
  record.set_selected(100);
  record.set_responded(100);
  record.set_outcome("all");
  record.set_duration_seconds(1.5);
  record.set_bytes_sent(int64_t{100} * 796840);
  record.set_bytes_received(int64_t{100} * 796840);
  record.mutable_metrics()->set_num_examples(60000);
  record.mutable_metrics()->set_train_loss(0.25);
  record.mutable_metrics()->set_train_accuracy(0.93);
  for (int i = 0; i < 100; ++i) {
    const std::string id =
        absl::StrCat("c", 1000000000000000 + round * 100 + i);
    record.add_selected_clients(id);
    record.add_accepted_clients(id);
  }
  return record;
}

void BM_SaveAfterARound(benchmark::State& state) {
  const ModelSpec spec = *LookupModel("mlp_2nn");
  const char* tmp = getenv("TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                 "/fedlearn-state-bench-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir);
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().message()).c_str());
    return;
  }
  History history;
  int64_t round = state.range(0);
  for (int64_t r = 1; r <= round; ++r) history.Append(Round(r));
  SavedRun run;
  run.state.set_run_id("0123456789abcdef");
  run.state.set_phase(v1::PHASE_TRAINING);
  run.state.set_mode("rounds");
  run.state.set_strategy("fedavg");
  run.weights = std::make_shared<std::vector<float>>(spec.num_parameters, 0.5f);
  // The directory of a run N rounds long.
  auto save = [&] {
    run.state.set_round(round + 1);
    run.state.set_model_round(round);
    run.records = history.Latest(history.total());
    return (*store)->Save(spec, run);
  };
  if (absl::Status s = save(); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  const int64_t written_before = BytesWritten(getpid());
  for (auto _ : state) {
    history.Append(Round(++round));
    if (absl::Status s = save(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
  }
  const double saves = static_cast<double>(state.iterations());
  state.counters["written_per_save"] =
      static_cast<double>(BytesWritten(getpid()) - written_before) / saves;
  uint64_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files += entry.file_size();
  }
  state.counters["dir_bytes"] = static_cast<double>(files);
  store->reset();
  std::filesystem::remove_all(dir);
}
// A fixed number of saves, so that every size's history grows by the same 50
// records while it is measured.
BENCHMARK(BM_SaveAfterARound)
    ->Arg(100)
    ->Arg(1000)
    ->Arg(10000)
    ->Iterations(50)
    ->Unit(benchmark::kMillisecond);

// What a save takes under the run's lock: a handle to each record it may
// have to write (RunController::SnapshotLocked), whose bytes the save then
// writes outside it. /N/N is every record of an N-record history, as every
// save took before SavedRun::records_from (per record one shared block's
// refcount and two words); /N/1 is what a save a round takes now, the one
// record since the last save.
void BM_HistoryHandlesForASave(benchmark::State& state) {
  History history;
  for (int64_t r = 1; r <= state.range(0); ++r) history.Append(Round(r));
  const size_t taken = static_cast<size_t>(state.range(1));
  for (auto _ : state) {
    std::vector<History::Record> records = history.Latest(taken);
    benchmark::DoNotOptimize(records.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(1));
}
BENCHMARK(BM_HistoryHandlesForASave)
    ->Args({1000, 1000})
    ->Args({10000, 10000})
    ->Args({100000, 100000})
    ->Args({1000, 1})
    ->Args({10000, 1})
    ->Args({100000, 1})
    ->Unit(benchmark::kMicrosecond);

// An async run's record: one per model version, one client's update.
v1::RoundRecord AsyncVersion(int64_t round) {
  v1::RoundRecord record;
  record.set_round(round);
  record.set_attempt(1);
  record.set_selected(1);
  record.set_responded(1);
  record.set_outcome("async");
  record.set_duration_seconds(0.02);
  record.set_bytes_sent(796840);
  record.set_bytes_received(796840);
  record.set_staleness(3);
  record.set_update_scale(0.25);
  record.mutable_metrics()->set_num_examples(600);
  record.mutable_metrics()->set_train_loss(0.25);
  record.mutable_metrics()->set_train_accuracy(0.93);
  const std::string id = absl::StrCat("c", 1000000000000000 + round % 1000);
  record.add_selected_clients(id);
  record.add_accepted_clients(id);
  return record;
}

// What the history holds in memory after N async versions, with
// --history_in_memory at its default (100,000) and at N (every record kept,
// as before the bound): the heap it takes (malloc's in-use bytes, before and
// after), per record made.
void BM_HistoryHeapAfterVersions(benchmark::State& state) {
  const auto n = static_cast<int64_t>(state.range(0));
  for (auto _ : state) {
    const size_t before = mallinfo2().uordblks;
    History history(History::kDefaultIdBytes,
                    static_cast<size_t>(state.range(1)));
    for (int64_t r = 1; r <= n; ++r) history.Append(AsyncVersion(r));
    const size_t after = mallinfo2().uordblks;
    state.counters["heap_mb"] = static_cast<double>(after - before) / 1e6;
    state.counters["kept"] = static_cast<double>(history.kept());
  }
}
BENCHMARK(BM_HistoryHeapAfterVersions)
    ->Args({1'000'000, 100'000})
    ->Args({1'000'000, 1'000'000})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fedlearn

BENCHMARK_MAIN();
