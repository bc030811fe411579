// The state-directory loader a restarted coordinator resumes from: any bytes
// as DIR/state.binpb, beside a valid model, optimizer and history file of the
// run it should name (model-2, optimizer-2 and two records of the tiny run;
// fuzz_util.h), so that the bytes decide how much of each it reads. It must
// never crash; a run it loads has the spec's number of weights and an
// optimizer slot of that size for each slot it names.

#include <cstdlib>
#include <memory>
#include <vector>

#include "fuzz/fuzz_util.h"

namespace {

// The store, opened once, holding TinyRun(): what the seed corpus's
// state.binpb names.
fedlearn::StateStore& Store() {
  using namespace fedlearn;
  static StateStore* store = [] {
    const ModelSpec& spec = fuzz::TinySpec();
    absl::StatusOr<std::unique_ptr<StateStore>> opened =
        StateStore::Open(fuzz::ScratchDir() + "/state");
    if (!opened.ok()) std::abort();
    const SavedRun run = fuzz::TinyRun();
    if (!(*opened)->Save(spec, run).ok()) std::abort();
    return opened->release();
  }();
  return *store;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  const ModelSpec& spec = fuzz::TinySpec();
  StateStore& store = Store();
  fuzz::WriteScratch(
      "state/state.binpb",
      absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<std::optional<SavedRun>> loaded = store.Load(spec);
  if (!loaded.ok() || !loaded->has_value()) return 0;
  const SavedRun& run = **loaded;
  if (run.weights == nullptr ||
      run.weights->size() != static_cast<size_t>(spec.num_parameters)) {
    std::abort();
  }
  for (const auto& [slot, values] : run.optimizer.slots) {
    if (values == nullptr ||
        values->size() != static_cast<size_t>(spec.num_parameters)) {
      std::abort();
    }
  }
  return 0;
}
