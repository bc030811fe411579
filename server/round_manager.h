#ifndef FEDLEARN_SERVER_ROUND_MANAGER_H_
#define FEDLEARN_SERVER_ROUND_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/fedavg.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/state_store.h"

namespace fedlearn {

// Immutable snapshot of the global weights; tasks share it with the streams
// sending it.
using Weights = std::shared_ptr<const std::vector<float>>;

// A task for one client, as RequestUpdate sends it.
struct Task {
  v1::TaskType type = v1::TASK_TYPE_WAIT;
  int64_t round = 0;
  bool run_validation = false;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration retry_after = absl::ZeroDuration();
  Weights weights;  // TRAIN and EVALUATE only
};

// Lets the round manager stop a push that is still streaming when its round
// closes, so that a stalled client cannot hold a staging buffer. The stream
// arms it with its cancel action and disarms it before finishing; Cancel after
// Disarm does nothing. Thread-safe.
class CancelHandle {
 public:
  explicit CancelHandle(std::function<void()> cancel)
      : cancel_(std::move(cancel)) {}
  void Cancel() {
    absl::MutexLock lock(&mu_);
    if (cancel_) std::exchange(cancel_, nullptr)();
  }
  void Disarm() {
    absl::MutexLock lock(&mu_);
    cancel_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

// Why a push was turned away, for the round's history.
enum class Rejection {
  kStaleRound,
  kDuplicate,
  kNotSelected,
  kInvalid,
  kTooLarge,
  kIncomplete
};

// The coordinator's state machine: client registry, sampling, tasks, streaming
// FedAvg, convergence, the evaluation phase and the run's history. Lifecycle:
//   WAITING_FOR_CLIENTS -> TRAINING(r) -> ... -> EVALUATING -> DONE.
// In async mode (CoordinatorOptions::mode) TRAINING has no rounds to wait
// for: every poll gets the latest model and every update is applied as it
// arrives (a history record each); the evaluation phase is the same.
// Every method is thread-safe; all state is guarded by one mutex, and callbacks
// handed in (poll completions, cancel actions) are always called without it
// held. A background thread enforces deadlines: round and evaluation timeouts,
// poll timeouts, gone clients. Errors carry the status codes of the wire
// contract (proto/fedlearn/v1/coordinator.proto).
class RoundManager {
 public:
  // `initial` holds spec.num_parameters() floats. `options` must be valid.
  // With a `store`, the run is saved there after every round and evaluation
  // attempt; with `resume` (a run loaded from it), the run goes on from there:
  // its weights replace `initial`, training resumes at the saved round (clients
  // join anew), an evaluation phase starts over, a finished run stays DONE.
  RoundManager(CoordinatorOptions options, ModelSpec spec,
               std::vector<float> initial,
               std::unique_ptr<StateStore> store = nullptr,
               std::optional<SavedRun> resume = std::nullopt);
  ~RoundManager();  // Shuts down.

  RoundManager(const RoundManager&) = delete;
  RoundManager& operator=(const RoundManager&) = delete;

  // Stops the run: pending polls and every later call fail with UNAVAILABLE;
  // pushes in flight are cancelled. Idempotent.
  void Shutdown();

  // Registers a client. UNAUTHENTICATED for a wrong join token,
  // RESOURCE_EXHAUSTED at
  // --max_clients, INVALID_ARGUMENT for a malformed request, UNAVAILABLE when
  // shutting down.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request);

  // Checks that `token` is `client_id`'s session token, and notes that the
  // client is alive. UNAUTHENTICATED for a missing or unknown token, NOT_FOUND
  // for an unknown client, PERMISSION_DENIED for another client's token.
  absl::Status Authorize(absl::string_view client_id, absl::string_view token);

  // Long poll for `client_id`'s next task (the client must be authorized).
  // `done` is called exactly once, never under the lock: with the task as soon
  // as there is one, with WAIT when `max_wait` (capped by --poll_timeout)
  // passes, with UNAVAILABLE at shutdown, or with CANCELLED after CancelPoll.
  // Returns an id for CancelPoll.
  using PollCallback = std::function<void(absl::StatusOr<Task>)>;
  uint64_t Poll(absl::string_view client_id, absl::Duration max_wait,
                PollCallback done);
  void CancelPoll(uint64_t poll_id);

  // Admits the header of a push before its chunks are read, so a push that
  // cannot count is turned away without reading the update. On success returns
  // a handle the caller arms against round close (see CancelHandle).
  // FAILED_PRECONDITION for a wrong phase, a stale round or an unselected
  // client; ALREADY_EXISTS for a second update; INVALID_ARGUMENT for bad
  // metadata. Rejections are counted in the round's history.
  absl::StatusOr<std::shared_ptr<CancelHandle>> AdmitUpdate(
      const v1::UpdateHeader& header, std::function<void()> cancel);

  // Folds a complete, verified update (a delta, num_parameters floats) into the
  // round's aggregate, re-checking the header against the state now. Closes the
  // round at quorum. Same errors as AdmitUpdate; a rejected update changes
  // nothing.
  absl::StatusOr<v1::PushGradientResponse> CommitUpdate(
      const v1::UpdateHeader& header, absl::Span<const float> delta,
      int64_t bytes);

  // Counts a push that failed while streaming (bad chunk, stream cut short).
  void RecordRejection(Rejection reason);

  // Accepts an evaluation report. FAILED_PRECONDITION outside EVALUATING or for
  // a client not asked to evaluate or a wrong round, ALREADY_EXISTS for a
  // second report, INVALID_ARGUMENT for non-finite or out-of-range metrics.
  absl::Status ReportEval(const v1::ReportEvalRequest& request);

  // Records liveness and progress.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);

  // The run as GetStatus reports it. With `counters`, also the run's counters
  // of the same moment (one lock), for /metrics.
  v1::GetStatusResponse GetStatus(RunCounters* counters = nullptr) const;

  // The current global weights; with `rounds`, also the number of rounds
  // folded into them.
  Weights global_weights(int64_t* rounds = nullptr) const;

  v1::Phase phase() const;

  // Waits until the run reaches `phase` (or a later one) or `timeout` passes;
  // returns whether it did.
  bool AwaitPhase(v1::Phase phase, absl::Duration timeout) const;

  // After DONE: waits until every live client has been told DONE (or `timeout`
  // passes), so that the coordinator can exit without leaving agents polling.
  // Returns whether all were told.
  bool AwaitClientsDone(absl::Duration timeout) const;

  // Waits until `n` polls are being held open (or `timeout` passes).
  bool AwaitPendingPolls(size_t n, absl::Duration timeout) const;

  // Waits until `n` rounds or evaluation attempts (closed or abandoned) are in
  // the history, or `timeout` passes; returns whether they are.
  bool AwaitHistory(size_t n, absl::Duration timeout) const;

  const ModelSpec& spec() const { return spec_; }
  const CoordinatorOptions& options() const { return options_; }
  int64_t chunk_bytes() const {
    return static_cast<int64_t>(options_.chunk_bytes);
  }

 private:
  struct Client;
  struct Attempt;
  struct Waiter {
    std::string client_id;
    absl::Time expiry;
    PollCallback done;
  };
  using Callbacks = std::vector<std::function<void()>>;

  bool IsAliveLocked(const Client& client, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::string> AliveClientsLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The task `client_id` should get now; WAIT when there is none.
  Task TaskForLocked(const std::string& client_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes what a client is about to be sent (a DONE, for AwaitClientsDone).
  void NoteSentLocked(const Task& task, Client* client)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands tasks to every waiting poll that now has one.
  void DeliverTasksLocked(Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a training round or evaluation attempt when the phase wants one and
  // enough clients are alive.
  void MaybeStartAttemptLocked(absl::Time now, Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartAttemptLocked(bool evaluation, std::vector<std::string> candidates,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the open attempt ("quorum", "all" or, below quorum, "abandoned").
  void CloseAttemptLocked(absl::string_view outcome, absl::Time now,
                          Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int QuorumLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With a store, a callback that saves the run as it is now (to be run
  // outside the lock); null without one.
  std::function<void()> SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the open attempt if every selected client, or a quorum, has
  // answered.
  void CloseIfAnsweredLocked(Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt's record so far; `outcome` as CloseAttemptLocked names it, or
  // "open".
  v1::RoundRecord RecordLocked(const Attempt& a, absl::string_view outcome,
                               absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a push header against the state; on rejection counts it.
  absl::Status CheckUpdateLocked(const v1::UpdateHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The part of it both modes share: example count, finite metrics, encoding.
  absl::Status CheckUpdateMetricsLocked(const v1::UpdateHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rounds mode: folds a checked update into the open round's aggregate and
  // closes the round at quorum.
  void FoldUpdateLocked(const v1::UpdateHeader& header,
                        absl::Span<const float> delta, int64_t bytes,
                        double norm, v1::PushGradientResponse* response,
                        Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The async-mode part of it: the client's task, staleness.
  absl::Status CheckAsyncUpdateLocked(const v1::UpdateHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Async mode: applies a checked update to the global model, records it and
  // stops training at max_rounds or convergence.
  void ApplyAsyncUpdateLocked(const v1::UpdateHeader& header,
                              absl::Span<const float> delta, int64_t bytes,
                              double norm, v1::PushGradientResponse* response,
                              Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The convergence test, both modes: compares `loss` (a round's, or an async
  // window's) with the previous one, notes the relative improvement in
  // `record`, keeps `loss` for next time; true when it improved by less than
  // convergence_threshold.
  bool ConvergedLocked(double loss, v1::RoundRecord* record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends training at model_round_ ("converged" or "max_rounds"): the
  // evaluation phase comes next.
  void StopTrainingLocked(bool converged, Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRejectionLocked(Rejection reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();
  void RunTimersLocked(absl::Time now, Callbacks* callbacks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time NextTimerLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const ModelSpec spec_;
  const v1::ModelSpec spec_proto_;
  const std::unique_ptr<StateStore> store_;  // null: nothing is saved
  std::string run_id_;                       // set once, in the constructor

  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_dirty_ ABSL_GUARDED_BY(mu_) = false;  // wakes the timer thread
  v1::Phase phase_ ABSL_GUARDED_BY(mu_) = v1::PHASE_WAITING_FOR_CLIENTS;
  int64_t round_ ABSL_GUARDED_BY(mu_) =
      1;  // the round being (or to be) trained
  int attempt_number_ ABSL_GUARDED_BY(mu_) =
      0;  // attempts of round_ (or of evaluation)
  std::unique_ptr<Attempt> attempt_
      ABSL_GUARDED_BY(mu_);  // the open attempt, if any
  Weights global_ ABSL_GUARDED_BY(mu_);
  int64_t model_round_ ABSL_GUARDED_BY(mu_) = 0;  // rounds folded into global_
  FedAvgAccumulator accumulator_ ABSL_GUARDED_BY(mu_);
  // Rounds mode: the previous round's train loss; async mode: the previous
  // window's (a window is as many updates as alive clients, at least
  // min_clients; see ApplyAsyncUpdateLocked).
  std::optional<double> previous_train_loss_ ABSL_GUARDED_BY(mu_);
  // Async mode: when the last update was applied (or training started), and
  // the train loss of the updates of the window so far.
  absl::Time last_applied_ ABSL_GUARDED_BY(mu_);
  WeightedMean window_loss_ ABSL_GUARDED_BY(mu_);
  int window_updates_ ABSL_GUARDED_BY(mu_) = 0;
  // Async mode: pushes being received, cancelled when training stops (rounds
  // mode keeps them in the open attempt).
  std::vector<std::shared_ptr<CancelHandle>> async_in_flight_
      ABSL_GUARDED_BY(mu_);
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::EvaluationResult> final_evaluation_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RoundRecord> history_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;      // weights handed to tasks
  int64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;  // accepted updates
  RunCounters counters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Client>> clients_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::string> join_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> client_by_token_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_poll_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::mt19937_64 sampler_ ABSL_GUARDED_BY(mu_);

  std::thread timer_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_ROUND_MANAGER_H_
