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
  // The history after the records state.history() holds (a coordinator puts
  // them all here), as they are kept, from its record `records_from` on: a
  // save appends the ones it has not written yet to the history file,
  // copying their bytes and parsing none. A coordinator passes those from
  // the last save it knows was written on, so that what it takes under its
  // lock for a save does not grow with the run. Load returns every record in
  // state.history().
  std::vector<History::Record> records;
  int64_t records_from = 0;
  // From Load: how many of state.history()'s records, the first ones, its
  // history file holds, so that the next Save need not be passed them.
  int64_t records_on_disk = 0;
  std::shared_ptr<const std::vector<float>> weights;
  OptimizerState optimizer;
};

// The coordinator's state directory (--state_dir):
//   state.binpb                  the CoordinatorState (binary protobuf),
//                                without the records of the history file
//   history-<run>-<n>.binpb      the run's records, appended as they close
//                                (state.proto: history_file); a save writes
//                                only the records new since the last one
//   model-<round>.safetensors    the global model it names (float32; numpy and
//                                PyTorch read it as it is)
//   optimizer-<round>.safetensors  the server optimizer's state vectors after
//                                that round, tensor "SLOT/NAME" for each slot
//                                (momentum, m, v) and model tensor NAME; only
//                                for an optimizer that keeps state
// Every file but the history file is written atomically (temp file, fsync,
// rename, fsync of the directory); the history file only grows, and is
// fdatasync'ed before the state that names its new length is written. A save
// writes the model file and the history first and the state that names them
// last, so after a crash at any point the directory holds one whole run: the
// old state with its old model and history (a longer history file's extra
// records are ignored, and overwritten by the next save), or the new state
// with its new ones. A save's cost does not grow with the run: the model, the
// state without the history file's records, and the records new since the
// last save (bench/state_bench).
class StateStore {
 public:
  // Opens `dir`, creating it if needed, and locks it (DIR/lock, flock) for
  // this process: FAILED_PRECONDITION while another coordinator holds it.
  // Removes temporary files a killed writer left. Errno-derived errors naming
  // the directory otherwise.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(std::string dir);

  // The saved run, or nullopt when the directory holds none; the next Save of
  // that run appends to its history file.
  // FAILED_PRECONDITION for a run of another model or a format version this
  // binary does not know; DATA_LOSS or INVALID_ARGUMENT, naming the file, for a
  // damaged or missing state, model or history file.
  absl::StatusOr<std::optional<SavedRun>> Load(const ModelSpec& spec);

  // Saves `run` (weights: spec.num_parameters floats). A save with a shorter
  // history than one already written is skipped, so that callers racing from
  // several threads never move the directory back in time. The history file
  // is appended to while `run` continues the run saved last (same run id, its
  // records a continuation of the ones written); otherwise, as for a new run
  // in the directory, a new one is started. FAILED_PRECONDITION, writing
  // nothing, when `run.records` start after a record the file does not hold.
  // Model, optimizer and history files no longer named by the state are
  // removed. Thread-safe.
  absl::Status Save(const ModelSpec& spec, const SavedRun& run);

  const std::string& dir() const { return dir_; }

  // The version written; Load also reads kOldestFormatVersion and after.
  static constexpr int kFormatVersion = 2;
  static constexpr int kOldestFormatVersion = 1;

 private:
  StateStore(std::string dir, int lock_fd)
      : dir_(std::move(dir)), lock_(lock_fd) {}

  const std::string dir_;
  const ScopedFd lock_;  // holds the directory's flock while open
  // Forgets what was written for another run: a save or load of `run_id`
  // when the last one was of another run (or none).
  void SwitchRunLocked(const std::string& run_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // The run the store last saved or loaded; what follows is about its files.
  std::string run_ ABSL_GUARDED_BY(mu_);
  int64_t saved_history_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t written_model_round_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t written_optimizer_round_ ABSL_GUARDED_BY(mu_) = -1;
  // The history file being appended to (empty: none yet), its generation (in
  // its name, which no file of the run reuses), and the records and bytes of
  // it that the last state written names: a save continuing the run appends
  // SavedRun::records from history_records_ on at history_bytes_.
  std::string history_file_ ABSL_GUARDED_BY(mu_);
  int64_t history_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t history_records_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t history_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STATE_STORE_H_
