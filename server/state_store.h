#ifndef FEDLEARN_SERVER_STATE_STORE_H_
#define FEDLEARN_SERVER_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/model_spec.h"
#include "fedlearn/v1/state.pb.h"
#include "server/history.h"
#include "server/strategy/server_optimizer.h"

namespace fedlearn {

// A run as the coordinator saves it: the round state, the global model of
// state.model_round() and the server optimizer's state after it.
struct SavedRun {
  v1::CoordinatorState state;
  // Written as the state's history after the records state.history() holds,
  // as they are kept: a save copies their bytes and parses none of them.
  // Load returns every record in state.history().
  std::vector<History::Record> records;
  std::shared_ptr<const std::vector<float>> weights;
  OptimizerState optimizer;
};

// The coordinator's state directory (--state_dir):
//   state.binpb                  the CoordinatorState (binary protobuf)
//   model-<round>.safetensors    the global model it names (float32; numpy and
//                                PyTorch read it as it is)
//   optimizer-<round>.safetensors  the server optimizer's state vectors after
//                                that round, tensor "SLOT/NAME" for each slot
//                                (momentum, m, v) and model tensor NAME; only
//                                for an optimizer that keeps state
// Every file is written atomically (temp file, fsync, rename, fsync of the
// directory). A save writes the model file first and the state that names it
// last, so after a crash at any point the directory holds one whole run: the
// old state with its old model, or the new state with its new model.
class StateStore {
 public:
  // Opens `dir`, creating it if needed, and locks it (DIR/lock, flock) for
  // this process: FAILED_PRECONDITION while another coordinator holds it.
  // Removes temporary files a killed writer left. Errno-derived errors naming
  // the directory otherwise.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(std::string dir);

  // The saved run, or nullopt when the directory holds none.
  // FAILED_PRECONDITION for a run of another model or a format version this
  // binary does not know; DATA_LOSS or INVALID_ARGUMENT, naming the file, for a
  // damaged state or model file.
  absl::StatusOr<std::optional<SavedRun>> Load(const ModelSpec& spec) const;

  // Saves `run` (weights: spec.num_parameters floats). A save with a shorter
  // history than one already written is skipped, so that callers racing from
  // several threads never move the directory back in time. Model files no
  // longer named by the state are removed. Thread-safe.
  absl::Status Save(const ModelSpec& spec, const SavedRun& run);

  const std::string& dir() const { return dir_; }

  static constexpr int kFormatVersion = 1;

 private:
  StateStore(std::string dir, int lock_fd)
      : dir_(std::move(dir)), lock_(lock_fd) {}

  const std::string dir_;
  const ScopedFd lock_;  // holds the directory's flock while open
  absl::Mutex mu_;
  int64_t saved_history_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t written_model_round_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t written_optimizer_round_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STATE_STORE_H_
